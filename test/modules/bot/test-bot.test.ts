import t from 'tap'
import { sql } from 'drizzle-orm'
import type { Db } from '../../../src/db/client.js'
import { queryRows } from '../../../src/db/rows.js'
import { openedBody } from '../../../src/modules/messages/message-body.js'
import { build, type Caller } from '../../helper.js'
import { until } from '../../support/until.js'

async function waitForEvents (caller: Caller, count: number, timeoutMs: number) {
  const deadline = Date.now() + timeoutMs
  let events: { type: string, data: Record<string, unknown> }[] = []
  while (events.length < count && Date.now() < deadline) {
    events = (await caller.get('/v2/events?wait=1')).json().events
  }
  return events
}

/**
 * Resolves once no bot can write another reply: every message to the bot is acknowledged (a bot
 * takes only unacknowledged ones, and acknowledges in the transaction that replies), and no
 * other connection is inside a transaction that might still commit one (PGlite runs one
 * transaction at a time, and this statement after it).
 */
async function botsDone (db: Db): Promise<void> {
  await until(async () => {
    const [row] = await queryRows<{ unanswered: number, busy: number }>(db, sql`
      SELECT (SELECT count(*) FROM events WHERE address = 'testbot' AND type = 'message.received' AND acked_at IS NULL)::int AS unanswered,
        (SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()
          AND backend_type = 'client backend' AND state <> 'idle')::int AS busy`)
    return row!.unanswered === 0 && row!.busy === 0
  }, { message: 'the bots never finished with their feed' })
}

/** The bot's replies as stored, their bodies opened (the table holds them sealed). */
async function botReplies (db: Db): Promise<{ body: string }[]> {
  const rows = await queryRows<{ id: string, body: string, sealed_by: string | null }>(db, sql`SELECT id, body, sealed_by FROM messages WHERE sender = 'testbot'`)
  return rows.map((r) => ({ body: openedBody({ id: r.id, body: r.body, sealedBy: r.sealed_by }) }))
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
    { type: 'message.received', data: { message: { sender: 'testbot', recipient: 'alice', body: 'echo: ping', replyTo: sent.json().id } } },
    { type: 'message.status', data: { message: sent.json().id, recipient: 'testbot', status: 'read' } }
  ])
  await botsDone(db)
  const replies = await botReplies(db)
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
  // Every send has committed: once the bots are done, each is answered, and nothing more comes.
  await botsDone(db)
  const replies = await botReplies(db)
  t.same(replies.map((r) => r.body).sort(), Array.from({ length: 12 }, (_, i) => `echo: b${i}`).sort())
})
