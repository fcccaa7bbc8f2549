import { spawn } from 'node:child_process'
import { connect } from 'node:net'
import { join } from 'node:path'
import t from 'tap'
import { build, type TestContext } from '../helper.js'
import { until } from '../support/until.js'

const BOT = join(import.meta.dirname, '..', '..', 'examples', 'webhook-bot.mjs')

/** The example bot as a child process with `key`, against `base`: killed at teardown. */
function startBot (t: TestContext, base: string, key: { keyId: string, secret: string }) {
  const child = spawn(process.execPath, [BOT], {
    env: { ...process.env, PARLEY_URL: base, PARLEY_KEY_ID: key.keyId, PARLEY_SECRET: key.secret, BOT_PORT: '0' },
    stdio: ['ignore', 'pipe', 'pipe']
  })
  let output = ''
  child.stdout.setEncoding('utf8').on('data', (chunk: string) => { output += chunk })
  child.stderr.setEncoding('utf8').on('data', (chunk: string) => { output += chunk })
  t.teardown(() => { child.kill('SIGKILL') })
  return { child, output: () => output }
}

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
  const { child, output } = startBot(t, base, bot)
  const exited = new Promise<number | null>((resolve) => child.on('exit', resolve))
  // Every 100 ms: alice's reads of her feed stay inside the default rate limit.
  const happens = (what: string, done: () => Promise<boolean> | boolean) =>
    until(done, { intervalMs: 100 }).catch(() => { throw new Error(`${what} did not happen within 10 s; the bot said:\n${output()}`) })
  await happens('the bot listening', () => output().includes('"listening"'))
  t.equal((await bot.get('/v2/webhooks')).json().webhooks.length, 1, 'it registered its webhook')

  t.equal((await alice.post('/v2/message', { recipient: 'echobot', body: 'hello bot' })).statusCode, 200)
  const bodies = async () => ((await alice.get('/v2/events')).json().events as { type: string, data: { message?: { body: string, recipient: string } } }[])
    .filter((e) => e.type === 'message.received').map((e) => `${e.data.message!.recipient}: ${e.data.message!.body}`)
  await happens('the direct answer', async () => (await bodies()).includes('alice: echo: hello bot'))
  t.pass('alice got "echo: hello bot"')

  const group = (await alice.post('/v2/group', { name: 'bots', members: ['echobot'] })).json()
  t.equal((await alice.post('/v2/message', { recipient: group.id, body: 'hello group' })).statusCode, 200)
  await happens('the group answer', async () => (await bodies()).includes(`${group.id}: echo: hello group`))
  t.pass('the group got "echo: hello group"')

  child.kill('SIGTERM')
  t.equal(await exited, 0, 'it stops cleanly on SIGTERM')
  t.equal((await bot.get('/v2/webhooks')).json().webhooks.length, 0, 'and deleted its webhook')
})

interface Answer { status: number | undefined, sent: number, error?: string }

/**
 * POSTs to the bot over a raw socket: the head and `total` bytes of body, never the body's end,
 * then waits for an answer: its status, or undefined after 3 s with none. A bot that reads
 * the whole body before it checks anything never answers.
 */
function hostilePost (port: number, headers: Record<string, string>, total: number): Promise<Answer> {
  return new Promise((resolve) => {
    let received = ''
    let error: string | undefined
    const socket = connect(port, '127.0.0.1')
    const finish = (answer: Answer) => {
      clearTimeout(timer)
      socket.destroy()
      resolve(answer)
    }
    const timer = setTimeout(() => finish({ status: undefined, sent: total, error: error ?? 'no answer in 3 s' }), 3_000)
    socket.on('data', (chunk: Buffer) => {
      received += chunk.toString('latin1')
      const status = /^HTTP\/1\.1 (\d{3}) /.exec(received)
      if (status !== null) finish({ status: Number(status[1]), sent: total })
    })
    socket.on('error', (err) => { error = err.message })
    const chunked = headers['transfer-encoding'] === 'chunked'
    const head = `POST /parley HTTP/1.1\r\nHost: 127.0.0.1\r\n${Object.entries(headers).map(([k, v]) => `${k}: ${v}\r\n`).join('')}\r\n`
    const body = Buffer.alloc(total, 'x')
    socket.write(Buffer.concat([Buffer.from(head), ...(chunked ? [Buffer.from(`${total.toString(16)}\r\n`), body] : [body])]))
  })
}

t.test('the example bot refuses an unsigned or oversized delivery before reading its body', async (t) => {
  const { app, as } = await build(t, { env: { WEBHOOK_ALLOW_PRIVATE: 'true' } })
  const base = await app.listen({ host: '127.0.0.1', port: 0 })
  const bot = await as('echobot')
  const { child, output } = startBot(t, base, bot)
  await until(() => output().includes('"listening"'), { intervalMs: 50, message: 'the bot listening' })
  const port = (JSON.parse(output().split('\n').find((l) => l.includes('"listening"'))!) as { listening: number }).listening

  const now = Math.floor(Date.now() / 1000)
  const wellFormed = `t=${now},v1=${'0'.repeat(64)}`
  const json = { 'content-type': 'application/json' }
  const cases: [string, Record<string, string>, number, number][] = [
    ['no signature header, 8 MiB announced', { ...json, 'content-length': String(8 << 20) }, 64 << 10, 401],
    ['a malformed signature header, chunked', { ...json, 'x-parley-signature': 'v1=abc', 'transfer-encoding': 'chunked' }, 64 << 10, 401],
    ['a stale signature, chunked', { ...json, 'x-parley-signature': `t=${now - 3600},v1=${'0'.repeat(64)}`, 'transfer-encoding': 'chunked' }, 64 << 10, 401],
    ['a well-formed signature, 8 MiB announced', { ...json, 'x-parley-signature': wellFormed, 'content-length': String(8 << 20) }, 64 << 10, 413],
    ['a well-formed signature, chunked past 1 MiB', { ...json, 'x-parley-signature': wellFormed, 'transfer-encoding': 'chunked' }, (1 << 20) + (64 << 10), 413]
  ]
  for (const [what, headers, sent, status] of cases) {
    const answer = await hostilePost(port, headers, sent)
    t.equal(answer.status, status, `${what}: answered ${status} without the body's end (${answer.sent} bytes sent${answer.error === undefined ? '' : `, ${answer.error}`})`)
  }
  // Still serving: a small body with a wrong signature is read and refused.
  const small = await fetch(`http://127.0.0.1:${port}/parley`, { method: 'POST', headers: { ...json, 'x-parley-signature': wellFormed }, body: '{"id":"1"}' })
  t.equal(small.status, 401)
  t.equal(child.exitCode, null, 'the bot is still running')
})
