import t from 'tap'
import { childDatabaseEnv, runCliInProcess, startServer } from '../support/processes.js'
import { usingPostgres } from '../support/databases.js'

const backend = usingPostgres() ? 'PostgreSQL' : 'the embedded database'

t.test(`on a running server (${backend}), an admin key creates a user and a key, and that key talks to the test bot at once`, async (t) => {
  const env = await childDatabaseEnv(t)
  t.equal((await runCliInProcess(['user', 'create', 'root'], env)).code, 0)
  const made = await runCliInProcess(['key', 'create', 'root', '--scope', 'admin', '--json'], env)
  t.equal(made.code, 0, made.stderr)
  const root = JSON.parse(made.stdout) as { keyId: string, secret: string }
  const server = await startServer(t, env)
  const call = async (path: string, auth: { keyId: string, secret: string }, body?: unknown) => {
    const res = await fetch(`${server.url}${path}`, {
      method: body === undefined ? 'GET' : 'POST',
      headers: {
        authorization: `Basic ${Buffer.from(`${auth.keyId}:${auth.secret}`).toString('base64')}`,
        ...(body === undefined ? {} : { 'content-type': 'application/json' })
      },
      ...(body === undefined ? {} : { body: JSON.stringify(body) })
    })
    return { status: res.status, json: await res.json() as Record<string, unknown> }
  }

  const user = await call('/v2/admin/users', root, { address: 'newbie', displayName: 'New' })
  t.equal(user.status, 200, JSON.stringify(user.json))
  const key = await call('/v2/admin/keys', root, { address: 'newbie' })
  t.equal(key.status, 200, JSON.stringify(key.json))
  const newbie = { keyId: key.json.keyId as string, secret: key.json.secret as string }

  const sent = await call('/v2/message', newbie, { recipient: 'testbot', body: 'hello from a key made over HTTP' })
  t.equal(sent.status, 200, JSON.stringify(sent.json))
  let reply: unknown
  let after = '0'
  for (let i = 0; i < 10 && reply === undefined; i++) {
    const feed = await call(`/v2/events?after=${after}&wait=5`, newbie)
    const events = feed.json.events as { type: string, data: { message: { sender: string, body: string } } }[]
    reply = events.find((e) => e.type === 'message.received' && e.data.message.sender === 'testbot')?.data.message.body
    after = feed.json.last as string
  }
  t.equal(reply, 'echo: hello from a key made over HTTP')
  t.match((await call('/v2/whoami', newbie)).json, { user: { address: 'newbie', displayName: 'New' }, key: { scopes: ['read', 'send'] } })
  t.equal(await server.stop(), 0)
})
