import pg from 'pg'
import t from 'tap'
import { usingPostgres } from '../support/databases.js'
import { longPollsWaiting } from '../support/metrics.js'
import { runCliInProcess, startServer } from '../support/processes.js'
import { postgresBin, throwawayPostgres } from '../support/throwaway-postgres.js'
import { until } from '../support/until.js'

const bin = postgresBin()
const skip = !usingPostgres()
  ? 'runs in the PostgreSQL pass (it brings its own cluster)'
  : bin === undefined ? 'no PostgreSQL server binaries (initdb) on this machine' : false

t.test('PostgreSQL going away: quick 503s, /readyz 503, and recovery without a restart', { skip }, async (t) => {
  const cluster = await throwawayPostgres(t, bin!)
  // The LISTEN connection's heartbeat (a SELECT 1) out of the way: its LISTEN (or the empty
  // NOTIFY that follows it) stays its last statement in pg_stat_activity, which is how this
  // test sees it back. Losing the connection with the server is noticed without it.
  const env = { DATABASE_URL: cluster.url, LISTEN_HEARTBEAT_MS: '3600000' }
  const server = await startServer(t, env)
  t.equal((await runCliInProcess(['user', 'create', 'alice'], env)).code, 0)
  t.equal((await runCliInProcess(['user', 'create', 'bob'], env)).code, 0)
  const keys: Record<string, string> = {}
  for (const address of ['alice', 'bob']) {
    const key = JSON.parse((await runCliInProcess(['key', 'create', address, '--json'], env)).stdout) as { keyId: string, secret: string }
    keys[address] = `Basic ${Buffer.from(`${key.keyId}:${key.secret}`).toString('base64')}`
  }
  const get = (path: string, as = 'alice') => fetch(`${server.url}${path}`, { headers: { authorization: keys[as]! }, signal: AbortSignal.timeout(15_000) })
  const send = (body: string) => fetch(`${server.url}/v2/message`, {
    method: 'POST', headers: { authorization: keys.alice!, 'content-type': 'application/json' }, body: JSON.stringify({ recipient: 'bob', body })
  })
  t.equal((await get('/v2/user/bob')).status, 200)
  t.equal((await send('before the outage')).status, 200)

  await cluster.stop()
  t.equal((await send('a private body')).status, 503)
  for (const path of ['/v2/user/bob', '/v2/events']) {
    const started = Date.now()
    const res = await get(path)
    const took = Date.now() - started
    t.equal(res.status, 503, path)
    t.match(await res.json(), { statusCode: 503, code: 'UNAVAILABLE' })
    t.ok(took < 6_000, `${path} answered in ${took} ms`)
  }
  const down = await fetch(`${server.url}/readyz`)
  t.equal(down.status, 503)
  t.equal((await fetch(`${server.url}/healthz`)).status, 200, 'the process itself is alive')
  t.match(server.output(), /"code":"UNAVAILABLE"/, 'logged for operators')
  for (const authorization of Object.values(keys)) {
    const secret = Buffer.from(authorization.slice(6), 'base64').toString().split(':')[1]!
    t.notOk(server.output().includes(secret), 'no secret in the log')
  }
  t.notMatch(server.output(), /params:|a private body/, 'no query parameters (message bodies, addresses) in the log')

  await cluster.start()
  await until(async () => (await fetch(`${server.url}/readyz`)).status === 200, { timeoutMs: 20_000, intervalMs: 50, message: '/readyz answering 200 again' })
  t.pass('/readyz answers 200 again')
  t.equal((await send('after the outage')).status, 200)

  // The LISTEN connection came back too (it retries on its own back-off): a waiting poll wakes on a new event.
  const look = new pg.Client({ connectionString: cluster.url })
  look.on('error', () => {})
  await look.connect()
  try {
    await until(async () => (await look.query("SELECT 1 FROM pg_stat_activity WHERE application_name LIKE 'parley listener %' AND (query LIKE 'LISTEN %' OR query LIKE 'NOTIFY %')")).rowCount! > 0, {
      timeoutMs: 20_000, intervalMs: 50, message: 'the server LISTENing again'
    })
  } finally {
    await look.end()
  }
  const poll = get('/v2/events?after=2&wait=10', 'bob')
  await until(async () => await longPollsWaiting(`${server.url}/metrics`) === 1, { message: 'bob\'s long-poll waiting' })
  const sentAt = Date.now()
  t.equal((await send('wake up')).status, 200)
  const page = await (await poll).json() as { events: { data: { message: { body: string } } }[] }
  t.equal(page.events[0]?.data.message.body, 'wake up')
  t.ok(Date.now() - sentAt < 2_000, `woken ${Date.now() - sentAt} ms after the send`)
})
