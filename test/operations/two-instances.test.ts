import { setTimeout as sleep } from 'node:timers/promises'
import t from 'tap'
import { redisReachable } from '../support/redis.js'
import { usingPostgres } from '../support/databases.js'
import { longPollsWaiting } from '../support/metrics.js'
import { childDatabaseEnv, runCliInProcess, startServer } from '../support/processes.js'
import { until } from '../support/until.js'

const skip = !usingPostgres()
  ? 'two processes need PostgreSQL: the embedded database belongs to one process'
  : await redisReachable() ? false : 'no Redis on 127.0.0.1:6379 for the shared rate limit'

t.test('two server processes on one PostgreSQL and one Redis behave as one service', { skip }, async (t) => {
  const env = { ...await childDatabaseEnv(t), REDIS_URL: 'redis://127.0.0.1:6379', RATE_LIMIT_PER_SECOND: '25' }
  const keys: Record<string, string> = {}
  for (const [address, quota] of [['alice', '10'], ['bob', undefined], ['carol', undefined]] as const) {
    t.equal((await runCliInProcess(['user', 'create', address], env)).code, 0)
    const args = ['key', 'create', address, '--json', ...(quota === undefined ? [] : ['--daily-quota', quota])]
    const key = JSON.parse((await runCliInProcess(args, env)).stdout) as { keyId: string, secret: string }
    keys[address] = `Basic ${Buffer.from(`${key.keyId}:${key.secret}`).toString('base64')}`
  }
  const [a, b] = await Promise.all([startServer(t, env), startServer(t, env)])
  // Both are ready by now: each tries its first retention sweep 5 s after it was.
  const ready = Date.now()
  const servers = [a!.url, b!.url]
  const call = (i: number, path: string, as: string, body?: unknown) => fetch(`${servers[i % 2]}${path}`, {
    method: body === undefined ? 'GET' : 'POST',
    headers: { authorization: keys[as]!, ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
    ...(body === undefined ? {} : { body: JSON.stringify(body) })
  })

  await t.test('the rate limit is shared', async (t) => {
    // 60 at once, 30 through each: counted per instance, all 60 would pass (25 each, refilled).
    // Shared, a GCRA bucket passes its burst of 25 plus one per 40 ms the burst took to arrive.
    const started = performance.now()
    const answers = await Promise.all(Array.from({ length: 60 }, (_, i) => call(i, '/v2/user/carol', 'carol')))
    const refilled = Math.ceil((performance.now() - started) / 40)
    const passed = answers.filter((r) => r.status === 200).length
    t.ok(passed >= 25 && passed <= 25 + refilled, `${passed} passed: the burst of 25, plus at most ${refilled} refilled meanwhile`)
    t.ok(passed < 50, 'far fewer than two instances counting apart would pass')
    t.equal(answers.filter((r) => r.status === 429).length, 60 - passed, 'the rest refused')
  })

  await t.test('a long-poll on one instance wakes on a send through the other', async (t) => {
    const poll = call(0, '/v2/events?wait=10', 'bob')
    await until(async () => await longPollsWaiting(`${servers[0]}/metrics`) === 1, { message: 'bob\'s long-poll waiting' })
    // carol spent her burst above: her send goes once her bucket has a place again (one per
    // 40 ms). A refused send writes nothing; the wake-up is timed from the one let through.
    let sentAt = 0
    let sent: Response | undefined
    await until(async () => {
      sentAt = Date.now()
      sent = await call(1, '/v2/message', 'carol', { recipient: 'bob', body: 'across processes' })
      if (sent.status !== 429) return true
      await sent.arrayBuffer()
      return false
    }, { message: 'carol\'s send let through by the rate limit' })
    t.equal(sent!.status, 200)
    const page = await (await poll).json() as { events: { data: { message: { body: string } } }[] }
    t.equal(page.events[0]?.data.message.body, 'across processes')
    t.ok(Date.now() - sentAt < 1_000, `woken in ${Date.now() - sentAt} ms`)
  })

  await t.test('the test bot answers once', async (t) => {
    t.equal((await call(0, '/v2/message', 'bob', { recipient: 'testbot', body: 'ping' })).status, 200)
    const echoes = async () => {
      const page = await (await call(1, '/v2/events?limit=100', 'bob')).json() as { events: { type: string, data: { message?: { body: string } } }[] }
      return page.events.filter((e) => e.type === 'message.received' && e.data.message?.body === 'echo: ping').length
    }
    await until(async () => await echoes() > 0, { intervalMs: 50, message: 'the bot\'s answer' })
    // A second answer (both instances' bots claiming the message) is written beside the first,
    // woken by the same notification: a second more lets it show.
    await sleep(1_000)
    t.equal(await echoes(), 1)
  })

  await t.test('the periodic retention sweep runs on one instance only', async (t) => {
    // Each process tries 5 s after it is ready, then every 10 minutes; the one that finds the
    // period's sweep done says nothing. So: one sweep logged, and both attempts made (with 1 s
    // for the later one's transaction) before the count.
    const sweeps = () => [a!, b!].filter((server) => server.output().includes('"msg":"retention sweep"')).length
    await until(() => sweeps() > 0, { timeoutMs: 15_000, intervalMs: 50, message: 'a retention sweep logged' })
    await sleep(Math.max(0, ready + 6_000 - Date.now()))
    t.equal(sweeps(), 1)
  })

  await t.test('the daily quota is exact', async (t) => {
    // alice's first requests: her rate-limit bucket (per key) is full, and 20 < its burst of 25.
    const answers = await Promise.all(Array.from({ length: 20 }, (_, i) => call(i, '/v2/message', 'alice', { recipient: 'bob', body: `q${i}` })))
    t.equal(answers.filter((r) => r.status === 200).length, 10)
    const refused = answers.filter((r) => r.status === 429)
    t.equal(refused.length, 10)
    t.match(await refused[0]!.json(), { code: 'QUOTA_EXCEEDED' })
  })
})
