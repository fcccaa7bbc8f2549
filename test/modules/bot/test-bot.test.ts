import t from 'tap'
import { sql } from 'drizzle-orm'
import { queryRows } from '../../../src/db/rows.js'
import { build, type Caller } from '../../helper.js'

async function waitForEvents (caller: Caller, count: number, timeoutMs: number) {
  const deadline = Date.now() + timeoutMs
  let events: { type: string, data: Record<string, unknown> }[] = []
  while (events.length < count && Date.now() < deadline) {
    events = (await caller.get('/v2/events?wait=1')).json().events
  }
  return events
}

t.test('the test bot answers each message once with echo: <body> and marks it read, with two instances running', async (t) => {
  const { as, db, secondInstance } = await build(t)
  await secondInstance()
  const alice = await as('alice')
  const started = Date.now()
  const sent = await alice.post('/v2/message', { recipient: 'testbot', body: 'ping' })
  t.equal(sent.statusCode, 200)
  const events = await waitForEvents(alice, 2, 5_000)
  const took = Date.now() - started
  t.ok(took < 2_000, `answered within 2 s (${took} ms)`)
  t.match(events, [
    { type: 'message.received', data: { message: { sender: 'testbot', recipient: 'alice', body: 'echo: ping' } } },
    { type: 'message.status', data: { message: sent.json().id, recipient: 'testbot', status: 'read' } }
  ])
  await new Promise((resolve) => setTimeout(resolve, 1_500))
  const replies = await queryRows<{ body: string }>(db, sql`SELECT body FROM messages WHERE sender = 'testbot'`)
  t.same(replies, [{ body: 'echo: ping' }], 'exactly one reply')
  const [delivery] = await queryRows<{ status: string }>(db, sql`SELECT status FROM deliveries WHERE message_id = ${sent.json().id}`)
  t.equal(delivery!.status, 'read')
  const [quota] = await queryRows<{ total: number }>(db, sql`SELECT coalesce(sum(count), 0)::int AS total FROM quota_usage`)
  t.equal(quota!.total, 1, 'the reply counts for no one')
})

t.test('a burst to the bot gets one reply per message', async (t) => {
  const { as, db, secondInstance } = await build(t, { env: { RATE_LIMIT_PER_SECOND: '1000' } })
  await secondInstance()
  const alice = await as('alice')
  await Promise.all(Array.from({ length: 12 }, (_, i) => alice.post('/v2/message', { recipient: 'testbot', body: `b${i}` })))
  const deadline = Date.now() + 10_000
  let replies: { body: string }[] = []
  while (Date.now() < deadline) {
    replies = await queryRows<{ body: string }>(db, sql`SELECT body FROM messages WHERE sender = 'testbot' ORDER BY body`)
    if (replies.length >= 12) break
    await new Promise((resolve) => setTimeout(resolve, 200))
  }
  await new Promise((resolve) => setTimeout(resolve, 1_200))
  replies = await queryRows<{ body: string }>(db, sql`SELECT body FROM messages WHERE sender = 'testbot' ORDER BY body`)
  t.same(replies.map((r) => r.body).sort(), Array.from({ length: 12 }, (_, i) => `echo: b${i}`).sort())
})
