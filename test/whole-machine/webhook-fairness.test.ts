import { setTimeout as sleep } from 'node:timers/promises'
import t from 'tap'
import { build } from '../helper.js'
import { until } from '../support/until.js'
import { startReceiver } from '../support/webhook-receiver.js'

// Five users whose receivers answer only after 4 s, each with ten webhooks and events flowing,
// beside a bystander's webhook on a fast receiver. Each slow user may hold two leases (20 of
// the 16 slots' worth of wishes, 10 taken); the other six slots must serve the bystander.
// Before the per-user cap was applied ahead of the claim's window, the window filled with the
// slow users' due webhooks and the bystander waited for their batches to end (p99 13-25 s).
const ENV = { WEBHOOK_ALLOW_PRIVATE: 'true', RATE_LIMIT_PER_SECOND: '100000', DAILY_MESSAGE_QUOTA: '100000' }
const SLOW_USERS = 5
const HOOKS_EACH = 10
const SLOW_MS = 4_000
const BOUND_MS = 1_000

const p99 = (values: number[]): number => [...values].sort((a, b) => a - b)[Math.ceil(values.length * 0.99) - 1] ?? 0

t.test('slow receivers of five users do not delay another user\'s webhook', async (t) => {
  const { as } = await build(t, { env: ENV })
  // Deliveries arrived at the slow receivers (each answered SLOW_MS later).
  let slowArrived = 0
  const slow = await startReceiver(t, () => { slowArrived++; return 200 }, SLOW_MS)
  const fast = await startReceiver(t)
  const sender = await as('sender')
  const bob = await as('bob')
  const slowUsers = await Promise.all(Array.from({ length: SLOW_USERS }, (_, i) => as(`slow${i}`)))
  for (const [u, user] of slowUsers.entries()) {
    for (let h = 0; h < HOOKS_EACH; h++) {
      t.equal((await user.post('/v2/webhooks', { url: `${slow.url}?u=${u}&h=${h}` })).statusCode, 200)
    }
  }
  t.equal((await bob.post('/v2/webhooks', { url: fast.url })).statusCode, 200)

  // The slow users' feeds keep growing: every one of their webhooks is due all along.
  let flooding = true
  const flood = (async () => {
    while (flooding) {
      await Promise.all(slowUsers.map((u) => sender.post('/v2/message', { recipient: u.address, body: 'for the slow' })))
      await sleep(500)
    }
  })()
  // The slow users hold every lease they may (two each) before the bystander starts.
  await until(() => slowArrived >= SLOW_USERS * 2, { message: `${SLOW_USERS * 2} deliveries waiting on the slow receivers` })

  // The bystander: a message to bob every 300 ms, timed from its send to its arrival.
  const sentAt = new Map<string, number>()
  for (let i = 0; i < 25; i++) {
    const started = performance.now()
    const res = await sender.post('/v2/message', { recipient: 'bob', body: `bystander ${i}` })
    t.equal(res.statusCode, 200)
    sentAt.set(res.json().id, started)
    await sleep(300)
  }
  await fast.until(() => fast.delivered().length >= 25, 30_000)
  flooding = false
  await flood
  const latencies: number[] = []
  for (const r of fast.delivered()) {
    const started = sentAt.get((r.event.data as { message: { id: string } }).message.id)
    if (started !== undefined) latencies.push(r.at - started)
  }
  t.equal(latencies.length, 25, 'every bystander message was delivered')
  t.comment(`bystander webhook delivery p99 ${p99(latencies).toFixed(0)} ms, max ${Math.max(...latencies).toFixed(0)} ms`)
  t.ok(p99(latencies) < BOUND_MS, `bystander delivery p99 < ${BOUND_MS} ms`)
  t.ok(slow.received.length > 0, `the slow receivers were being served (${slow.received.length} answered)`)
})
