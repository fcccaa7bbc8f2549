import t from 'tap'
import { sql } from 'drizzle-orm'
import { queryRows } from '../../../src/db/rows.js'
import { KEY_CACHE_MS } from '../../../src/modules/keys/authenticator.js'
import { createKeysRepository } from '../../../src/modules/keys/keys.repository.js'
import { build } from '../../helper.js'
import { movableClock } from '../../support/clock.js'

const MESSAGE_ID = /^msg_[0-9a-z]{26}$/

t.test('POST /v2/message sends in all three body formats', async (t) => {
  const { as } = await build(t)
  const alice = await as('alice')
  await as('bob')
  for (const format of ['json', 'form', 'multipart'] as const) {
    const res = await alice.post('/v2/message', { recipient: 'Bob', body: `hello by ${format}` }, { format })
    t.equal(res.statusCode, 200, format)
    t.match(res.json(), { id: MESSAGE_ID, sender: 'alice', recipient: 'bob', body: `hello by ${format}`, attachments: [] }, format)
    t.match(res.json().createdAt, /\.\d{3}Z$/)
  }
  const bob = await as('bob')
  const feed = await bob.get('/v2/events')
  t.same(feed.json().events.map((e: { data: { message: { body: string } } }) => e.data.message.body), ['hello by json', 'hello by form', 'hello by multipart'])
})

t.test('one send writes the message, a delivery row, an event and the quota count together', async (t) => {
  const { as, db } = await build(t)
  const alice = await as('alice')
  await as('bob')
  const sent = (await alice.post('/v2/message', { recipient: 'bob', body: 'hi' })).json()
  const [row] = await queryRows<Record<string, unknown>>(db, sql`
    SELECT (SELECT count(*)::int FROM messages WHERE id = ${sent.id}) AS messages,
           (SELECT status FROM deliveries WHERE message_id = ${sent.id} AND recipient = 'bob') AS delivery,
           (SELECT count(*)::int FROM events WHERE message_id = ${sent.id} AND address = 'bob' AND type = 'message.received') AS events,
           (SELECT count FROM quota_usage WHERE key_id = ${alice.keyId}) AS quota`)
  t.same(row, { messages: 1, delivery: 'sent', events: 1, quota: 1 })
})

t.test('POST /v2/message validates its fields, naming the one at fault', async (t) => {
  const { as, db } = await build(t, { env: { MAX_BODY_CHARS: '20' } })
  const alice = await as('alice')
  await as('bob')
  const cases: [Record<string, unknown>, number, RegExp][] = [
    [{ body: 'hi' }, 400, /recipient/],
    [{ recipient: 'bob' }, 400, /body: must not be empty unless the message has an attachment/],
    [{ recipient: 'bob', body: '' }, 400, /body/],
    [{ recipient: 'bob', body: 'x'.repeat(21) }, 400, /body.*20/],
    [{ recipient: 'not_valid!', body: 'hi' }, 400, /recipient/],
    [{ recipient: 'bob', body: 'hi', attachment: [{ filename: 'x.png', contentType: 'image/png', size: 1 }] }, 400, /attachment: files are sent as multipart/],
    [{ recipient: 'carol', body: 'hi' }, 404, /user carol not found/],
    [{ recipient: 'grp_00000000000000000000000000', body: 'hi' }, 404, /group grp_00000000000000000000000000 not found/]
  ]
  for (const [body, status, message] of cases) {
    for (const format of ['json', 'form'] as const) {
      if (format === 'form' && body.attachment !== undefined) continue
      const res = await alice.post('/v2/message', body, { format })
      t.equal(res.statusCode, status, `${JSON.stringify(body).slice(0, 60)} as ${format}`)
      t.match(res.json(), { statusCode: status, message }, `${format}: names the field`)
    }
  }
  const [left] = await queryRows<{ n: number }>(db, sql`SELECT (SELECT count(*) FROM messages)::int + (SELECT count(*) FROM events)::int + (SELECT coalesce(sum(count), 0) FROM quota_usage)::int AS n`)
  t.equal(left!.n, 0, 'a refused send leaves nothing behind and counts no quota')
})

t.test('POST /v2/message answers 429 QUOTA_EXCEEDED on the 101st send of the day, with X-Quota headers', async (t) => {
  const { as } = await build(t, { env: { RATE_LIMIT_PER_SECOND: '1000' } })
  const alice = await as('alice')
  await as('bob')
  let last
  for (let i = 1; i <= 100; i++) {
    last = await alice.post('/v2/message', { recipient: 'bob', body: `n${i}` })
    if (last.statusCode !== 200) break
  }
  t.equal(last!.statusCode, 200)
  t.equal(last!.headers['x-quota-limit'], '100')
  t.equal(last!.headers['x-quota-remaining'], '0')
  const midnight = new Date()
  midnight.setUTCHours(24, 0, 0, 0)
  t.equal(last!.headers['x-quota-reset'], String(midnight.getTime() / 1000))
  const refused = await alice.post('/v2/message', { recipient: 'bob', body: 'one too many' })
  t.equal(refused.statusCode, 429)
  t.same(refused.json(), {
    statusCode: 429,
    error: 'Too Many Requests',
    message: 'Daily message quota of 100 reached; contact the operator for higher volume',
    code: 'QUOTA_EXCEEDED'
  })
  t.equal(refused.headers['x-quota-limit'], '100')
  t.equal(refused.headers['x-quota-remaining'], '0')
  t.ok(Number(refused.headers['retry-after']) > 0)
  const bob = await as('bob')
  t.equal((await bob.post('/v2/message', { recipient: 'alice', body: 'my own quota' })).statusCode, 200, 'quota is per key')
})

t.test('a key\'s own daily quota overrides the default, and a change applies within 5 s', async (t) => {
  const clock = movableClock()
  const { as, db } = await build(t, { now: clock.now })
  const alice = await as('alice', { dailyQuota: 2 })
  await as('bob')
  const first = await alice.post('/v2/message', { recipient: 'bob', body: '1' })
  t.equal(first.headers['x-quota-limit'], '2')
  t.equal(first.headers['x-quota-remaining'], '1')
  t.equal((await alice.post('/v2/message', { recipient: 'bob', body: '2' })).statusCode, 200)
  t.equal((await alice.post('/v2/message', { recipient: 'bob', body: '3' })).statusCode, 429)
  await createKeysRepository(db).setDailyQuota(alice.keyId, 3)
  // The key is cached for KEY_CACHE_MS by the app's clock: move it past that.
  clock.advance(KEY_CACHE_MS + 100)
  const after = await alice.post('/v2/message', { recipient: 'bob', body: '3' })
  t.equal(after.statusCode, 200)
  t.equal(after.headers['x-quota-remaining'], '0')
})

t.test('Idempotency-Key: a repeat answers the original; different fields 422; no second message or quota', async (t) => {
  const { as, db } = await build(t)
  const alice = await as('alice')
  await as('bob')
  const headers = { 'idempotency-key': 'order-42' }
  const first = await alice.post('/v2/message', { recipient: 'bob', body: 'pay 5' }, { headers })
  t.equal(first.statusCode, 200)
  const again = await alice.post('/v2/message', { recipient: 'bob', body: 'pay 5' }, { headers, format: 'form' })
  t.equal(again.statusCode, 200)
  t.same(again.json(), first.json(), 'the same message, same id')
  t.equal(again.headers['x-quota-remaining'], '99', 'the replay counts no quota')
  const changed = await alice.post('/v2/message', { recipient: 'bob', body: 'pay 500' }, { headers })
  t.equal(changed.statusCode, 422)
  t.match(changed.json(), { code: 'IDEMPOTENCY_MISMATCH', message: /order-42/ })
  const other = await (await as('carol')).post('/v2/message', { recipient: 'bob', body: 'pay 5' }, { headers })
  t.not(other.json().id, first.json().id, 'keys are scoped to the API key')
  const [count] = await queryRows<{ n: number }>(db, sql`SELECT count(*)::int AS n FROM messages WHERE sender = 'alice'`)
  t.equal(count!.n, 1)
  const bad = await alice.post('/v2/message', { recipient: 'bob', body: 'x' }, { headers: { 'idempotency-key': 'x'.repeat(256) } })
  t.equal(bad.statusCode, 400)
  t.match(bad.json(), { message: /idempotency-key/ })
})

t.test('Idempotency-Key: concurrent duplicates never make a second message', async (t) => {
  const { as, db } = await build(t)
  const alice = await as('alice')
  await as('bob')
  const headers = { 'idempotency-key': 'burst' }
  const answers = await Promise.all(Array.from({ length: 8 }, () => alice.post('/v2/message', { recipient: 'bob', body: 'once' }, { headers })))
  const ok = answers.filter((a) => a.statusCode === 200)
  t.ok(ok.length >= 1)
  t.ok(answers.every((a) => a.statusCode === 200 || a.statusCode === 409), 'each answer is the original or 409')
  t.equal(new Set(ok.map((a) => a.json().id)).size, 1, 'one message id')
  const [row] = await queryRows<{ messages: number, quota: number }>(db, sql`SELECT (SELECT count(*) FROM messages)::int AS messages, (SELECT count FROM quota_usage) AS quota`)
  t.same(row, { messages: 1, quota: 1 })
})
