import { spawn } from 'node:child_process'
import { join } from 'node:path'
import t from 'tap'
import { build } from '../helper.js'

const BOT = join(import.meta.dirname, '..', '..', 'examples', 'webhook-bot.mjs')

/**
 * examples/webhook-bot.mjs as a user would run it: a child process with its own key, against a
 * listening server. It registers its webhook, answers a direct message and a group message
 * through the API, and deletes its webhook when stopped.
 */
t.test('the example webhook bot answers messages through the API', async (t) => {
  const { app, as } = await build(t, { env: { WEBHOOK_ALLOW_PRIVATE: 'true' } })
  const base = await app.listen({ host: '127.0.0.1', port: 0 })
  const bot = await as('echobot')
  const alice = await as('alice')
  const child = spawn(process.execPath, [BOT], {
    env: { ...process.env, PARLEY_URL: base, PARLEY_KEY_ID: bot.keyId, PARLEY_SECRET: bot.secret, BOT_PORT: '0' },
    stdio: ['ignore', 'pipe', 'pipe']
  })
  let output = ''
  child.stdout.setEncoding('utf8').on('data', (chunk: string) => { output += chunk })
  child.stderr.setEncoding('utf8').on('data', (chunk: string) => { output += chunk })
  const exited = new Promise<number | null>((resolve) => child.on('exit', resolve))
  t.teardown(() => { child.kill('SIGKILL') })
  const until = async (what: string, done: () => Promise<boolean> | boolean) => {
    for (let i = 0; i < 100; i++) {
      if (await done()) return
      await new Promise((resolve) => setTimeout(resolve, 100))
    }
    throw new Error(`${what} did not happen within 10 s; the bot said:\n${output}`)
  }
  await until('the bot listening', () => output.includes('"listening"'))
  t.equal((await bot.get('/v2/webhooks')).json().webhooks.length, 1, 'it registered its webhook')

  t.equal((await alice.post('/v2/message', { recipient: 'echobot', body: 'hello bot' })).statusCode, 200)
  const bodies = async () => ((await alice.get('/v2/events')).json().events as { type: string, data: { message?: { body: string, recipient: string } } }[])
    .filter((e) => e.type === 'message.received').map((e) => `${e.data.message!.recipient}: ${e.data.message!.body}`)
  await until('the direct answer', async () => (await bodies()).includes('alice: echo: hello bot'))
  t.pass('alice got "echo: hello bot"')

  const group = (await alice.post('/v2/group', { name: 'bots', members: ['echobot'] })).json()
  t.equal((await alice.post('/v2/message', { recipient: group.id, body: 'hello group' })).statusCode, 200)
  await until('the group answer', async () => (await bodies()).includes(`${group.id}: echo: hello group`))
  t.pass('the group got "echo: hello group"')

  child.kill('SIGTERM')
  t.equal(await exited, 0, 'it stops cleanly on SIGTERM')
  t.equal((await bot.get('/v2/webhooks')).json().webhooks.length, 0, 'and deleted its webhook')
})
