import t from 'tap'
import { sql } from 'drizzle-orm'
import { queryRows } from '../../../src/db/rows.js'
import { createEventsRepository, type NewEvent } from '../../../src/modules/events/events.repository.js'
import { purgeExpired } from '../../../src/modules/retention/retention.js'
import { build } from '../../helper.js'
import { metric } from '../../support/metrics.js'
import { until } from '../../support/until.js'

async function sendMany (caller: { post: (url: string, body: Record<string, unknown>) => Promise<{ statusCode: number }> }, to: string, n: number) {
  for (let i = 1; i <= n; i++) await caller.post('/v2/message', { recipient: to, body: `m${i}` })
}

t.test('GET /v2/events pages with after and limit; last is the cursor', async (t) => {
  const { as } = await build(t)
  const alice = await as('alice')
  const bob = await as('bob')
  await sendMany(alice, 'bob', 5)
  const first = (await bob.get('/v2/events?limit=2')).json()
  t.same(first.events.map((e: { id: string }) => e.id), ['1', '2'])
  t.equal(first.last, '2')
  t.match(first.events[0], { id: '1', type: 'message.received', createdAt: /Z$/, data: { message: { sender: 'alice', recipient: 'bob', body: 'm1' } } })
  const next = (await bob.get(`/v2/events?after=${first.last}&limit=10`)).json()
  t.same(next.events.map((e: { id: string }) => e.id), ['3', '4', '5'])
  const empty = (await bob.get('/v2/events?after=5')).json()
  t.same(empty, { events: [], last: '5' }, 'an empty page gives back the after it was given')
  t.equal((await alice.get('/v2/events')).json().events.length, 0, 'feeds are per user')
  for (const bad of ['after=-1', 'after=abc', 'limit=0', 'limit=1001', 'wait=31']) {
    const res = await bob.get(`/v2/events?${bad}`)
    t.equal(res.statusCode, 400, bad)
    t.match(res.json(), { code: 'VALIDATION_FAILED', message: new RegExp(bad.split('=')[0]!) })
  }
})

t.test('an event is answered as stored, also one written before its type\'s schema changed', async (t) => {
  const { as, db } = await build(t)
  const bob = await as('bob')
  // group.created as it was before it lost its member list (API.md §13): events live 30 days.
  const data = { group: { id: 'grp_old', name: 'old', owner: 'alice', members: ['alice', 'bob'], createdAt: '2026-01-01T00:00:00.000Z' } }
  await createEventsRepository(db).append([{ address: 'bob', type: 'group.created', data } as unknown as NewEvent])
  const res = await bob.get('/v2/events')
  t.equal(res.statusCode, 200)
  t.same(res.json().events.map((e: { data: unknown }) => e.data), [data])
})

t.test('every key of a user reads the same feed', async (t) => {
  const { as, createKey, callerFor } = await build(t)
  const alice = await as('alice')
  await as('bob')
  const second = callerFor('bob', await createKey('bob'))
  await sendMany(alice, 'bob', 1)
  t.equal((await second.get('/v2/events')).json().events.length, 1)
})

t.test('POST /v2/events/ack by ids or upTo; acknowledged events are not returned; others\' ids are ignored', async (t) => {
  const { as } = await build(t)
  const alice = await as('alice')
  const bob = await as('bob')
  const carol = await as('carol')
  await sendMany(alice, 'bob', 5)
  await sendMany(alice, 'carol', 2)
  t.equal((await bob.post('/v2/events/ack', { ids: ['2', '4'] })).statusCode, 204)
  t.same((await bob.get('/v2/events')).json().events.map((e: { id: string }) => e.id), ['1', '3', '5'])
  t.equal((await bob.post('/v2/events/ack', { upTo: '3' }, { format: 'form' })).statusCode, 204)
  t.same((await bob.get('/v2/events')).json().events.map((e: { id: string }) => e.id), ['5'])
  t.equal((await bob.post('/v2/events/ack', { ids: '5' }, { format: 'form' })).statusCode, 204, 'one form field is a one-element list')
  t.same((await bob.get('/v2/events')).json().events, [])
  t.equal((await carol.get('/v2/events')).json().events.length, 2, 'bob acknowledged his ids 1 and 2, not carol\'s')
  const none = await bob.post('/v2/events/ack', {})
  t.equal(none.statusCode, 400)
  t.match(none.json(), { code: 'VALIDATION_FAILED', message: /ids.*upTo/ })
  t.equal((await bob.post('/v2/events/ack', { ids: ['x'] })).statusCode, 400)
})

t.test('DELETE /v2/events removes all, or those up to upTo', async (t) => {
  const { as } = await build(t)
  const alice = await as('alice')
  const bob = await as('bob')
  await sendMany(alice, 'bob', 4)
  t.equal((await bob.delete('/v2/events?upTo=2')).statusCode, 204)
  t.same((await bob.get('/v2/events')).json().events.map((e: { id: string }) => e.id), ['3', '4'])
  t.equal((await bob.delete('/v2/events')).statusCode, 204)
  t.same((await bob.get('/v2/events')).json().events, [])
  await sendMany(alice, 'bob', 1)
  t.same((await bob.get('/v2/events')).json().events.map((e: { id: string }) => e.id), ['5'], 'ids keep increasing after a delete')
})

t.test('GET /v2/events?wait holds an empty answer until an event arrives', async (t) => {
  const { app, as } = await build(t)
  const alice = await as('alice')
  const bob = await as('bob')
  const started = Date.now()
  const poll = bob.get('/v2/events?wait=10')
  await until(async () => await metric(app, 'parley_long_polls_open') === 1, { message: 'the long-poll never waited' })
  await alice.post('/v2/message', { recipient: 'bob', body: 'wake up' })
  const res = await poll
  const took = Date.now() - started
  t.equal(res.statusCode, 200)
  t.match(res.json(), { events: [{ data: { message: { body: 'wake up' } } }], last: '1' })
  t.ok(took < 5_000, `answered as the event arrived (${took} ms)`)
  const idle = Date.now()
  const timedOut = await bob.get('/v2/events?after=1&wait=1')
  t.same(timedOut.json(), { events: [], last: '1' })
  t.ok(Date.now() - idle >= 900, 'an idle wait runs its course')
})

t.test('events past expiresAt are not returned; retention purges acknowledged and old events', async (t) => {
  const { as, db } = await build(t)
  const bob = await as('bob')
  const lapsed = new Date(Date.now() - 1000)
  const live = new Date(Date.now() + 60_000)
  await createEventsRepository(db).append([
    { address: 'bob', type: 'typing.started', data: { from: 'alice', to: 'bob', expiresAt: lapsed.toISOString() }, expiresAt: lapsed },
    { address: 'bob', type: 'typing.started', data: { from: 'carol', to: 'bob', expiresAt: live.toISOString() }, expiresAt: live }
  ])
  t.same((await bob.get('/v2/events')).json().events.map((e: { data: { from: string } }) => e.data.from), ['carol'])

  await createEventsRepository(db).append([
    { address: 'bob', type: 'message.deleted', data: { message: 'old-acked' } },
    { address: 'bob', type: 'message.deleted', data: { message: 'ancient' } },
    { address: 'bob', type: 'message.deleted', data: { message: 'recent-acked' } },
    { address: 'bob', type: 'message.deleted', data: { message: 'fresh' } }
  ])
  await db.execute(sql`UPDATE events SET acked_at = now() - interval '8 days' WHERE data->>'message' = 'old-acked'`)
  await db.execute(sql`UPDATE events SET created_at = now() - interval '31 days' WHERE data->>'message' = 'ancient'`)
  await db.execute(sql`UPDATE events SET acked_at = now() - interval '1 day' WHERE data->>'message' = 'recent-acked'`)
  await db.execute(sql`UPDATE events SET expires_at = now() - interval '2 minutes' WHERE data->>'from' = 'alice'`)
  const result = await purgeExpired(db)
  t.match(result, { ran: true, events: 3 })
  const left = await queryRows<{ label: string }>(db, sql`SELECT coalesce(data->>'message', data->>'from') AS label FROM events ORDER BY seq`)
  t.same(left.map((r) => r.label), ['carol', 'recent-acked', 'fresh'])
})

t.test('long-polls waiting at once are capped per API key (429), without touching other keys', async (t) => {
  const { app, as } = await build(t, { env: { MAX_LONG_POLLS_PER_KEY: '2' } })
  const alice = await as('alice')
  const bob = await as('bob')
  const first = [bob.get('/v2/events?wait=3'), bob.get('/v2/events?wait=3')]
  await until(async () => await metric(app, 'parley_long_polls_open') === 2, { message: 'the two long-polls never both waited' })
  const third = await bob.get('/v2/events?wait=3')
  t.equal(third.statusCode, 429)
  t.match(third.json(), { code: 'RATE_LIMITED', message: 'Too many requests/second, please try again later' })
  t.equal(third.headers['retry-after'], '1')
  t.equal((await bob.get('/v2/events')).statusCode, 200, 'a poll that does not wait is not capped')
  const others = alice.get('/v2/events?wait=1')
  await alice.post('/v2/message', { recipient: 'bob', body: 'done waiting' })
  const answered = await Promise.all(first)
  t.same(answered.map((r) => r.statusCode), [200, 200])
  t.equal((await others).statusCode, 200, 'another key polls freely')
  t.equal((await bob.get('/v2/events?after=1&wait=1')).statusCode, 200, 'the cap frees as polls return')
})
