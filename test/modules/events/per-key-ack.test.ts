import { sql } from 'drizzle-orm'
import t from 'tap'
import { queryRows } from '../../../src/db/rows.js'
import { createKeysRepository } from '../../../src/modules/keys/keys.repository.js'
import { purgeExpired } from '../../../src/modules/retention/retention.js'
import { build, type Caller } from '../../helper.js'

async function ids (caller: Caller, query = ''): Promise<string[]> {
  const res = await caller.get(`/v2/events?limit=1000${query}`)
  return (res.json().events as { id: string }[]).map((e) => e.id)
}

async function stored (db: Parameters<typeof queryRows>[0]): Promise<string[]> {
  return (await queryRows<{ seq: string }>(db, sql`SELECT seq::text AS seq FROM events WHERE address = 'bob' ORDER BY seq`)).map((r) => r.seq)
}

t.test('one key\'s acknowledgement is its own: the user\'s other keys still receive those events', async (t) => {
  const { as, createKey, callerFor, db } = await build(t)
  const alice = await as('alice')
  const bot = await as('bob')
  const console = callerFor('bob', await createKey('bob'))
  for (let i = 0; i < 6; i++) await alice.post('/v2/message', { recipient: 'bob', body: `m${i}` })
  const all = await ids(bot)
  t.equal(all.length, 6)

  t.equal((await bot.post('/v2/events/ack', { upTo: all[2] })).statusCode, 204)
  t.same(await ids(bot), all.slice(3), 'the acknowledging key no longer gets them')
  t.same(await ids(console), all, 'another key of the same user still does')
  t.equal((await bot.post('/v2/events/ack', { ids: [all[4], all[0], '999'] })).statusCode, 204)
  t.same(await ids(bot), [all[3], all[5]], 'ids past the mark, one at a time; unknown ids ignored')
  t.equal((await bot.post('/v2/events/ack', { upTo: all[1] })).statusCode, 204)
  t.same(await ids(bot), [all[3], all[5]], 'the mark never moves back')
  t.equal((await bot.post('/v2/events/ack', { upTo: all[4] })).statusCode, 204)
  t.same(await ids(bot), [all[5]])
  t.same(await stored(db), all, 'nothing is purged while a key has not acknowledged it')

  t.equal((await console.delete(`/v2/events?upTo=${all[1]}`)).statusCode, 204)
  t.same(await ids(console), all.slice(2), 'DELETE acts for its key too')
  t.same(await ids(bot), [all[5]])
  t.equal((await console.delete('/v2/events')).statusCode, 204)
  t.same(await ids(console), [])
  t.same(await ids(bot), [all[5]], 'the other key keeps the one it has not acknowledged')

  // A key made now (a new device) reads what is left of the feed from the start.
  const later = callerFor('bob', await createKey('bob'))
  t.same(await ids(later), all)
})

t.test('a long-poll waits for what its own key has not acknowledged', async (t) => {
  const { as, createKey, callerFor } = await build(t)
  const alice = await as('alice')
  const one = await as('bob')
  const two = callerFor('bob', await createKey('bob'))
  await alice.post('/v2/message', { recipient: 'bob', body: 'first' })
  const [first] = await ids(one)
  t.equal((await one.post('/v2/events/ack', { upTo: first })).statusCode, 204)
  const started = Date.now()
  t.same(await ids(two, '&wait=5'), [first], 'the other key is answered at once')
  t.ok(Date.now() - started < 4_000)
  const waiting = ids(one, '&after=0&wait=5')
  await alice.post('/v2/message', { recipient: 'bob', body: 'second' })
  const woken = await waiting
  t.equal(woken.length, 1, 'the acknowledging key waits, and is woken by the next event only')
  t.not(woken[0], first)
})

t.test('an event is purged once every active key has acknowledged it and the user\'s webhooks have sent it', async (t) => {
  const { as, createKey, callerFor, db } = await build(t)
  const alice = await as('alice')
  const one = await as('bob')
  const twoKey = await createKey('bob')
  const two = callerFor('bob', twoKey)
  const readless = await createKeysRepository(db).create('bob', null, { scopes: ['send'] })
  for (let i = 0; i < 4; i++) await alice.post('/v2/message', { recipient: 'bob', body: `m${i}` })
  const all = await ids(one)

  await one.post('/v2/events/ack', { upTo: all[3] })
  await purgeExpired(db)
  t.same(await stored(db), all, 'one key of two: nothing goes')
  await two.post('/v2/events/ack', { upTo: all[1] })
  await purgeExpired(db)
  t.same(await stored(db), all.slice(2), 'both keys have the first two (a key without read does not count)')
  t.ok(readless.keyId)

  // A revoked key holds nothing back.
  await createKeysRepository(db).revoke(twoKey.keyId)
  await purgeExpired(db)
  t.same(await stored(db), [], 'the one active key has them all')
  const acks = await queryRows<{ n: number }>(db, sql`SELECT count(*)::int AS n FROM event_acks`)
  t.equal(acks[0]!.n, 0, 'no acknowledgement outlives its event')

  // A webhook that has not sent an event keeps it.
  await db.execute(sql`INSERT INTO webhooks (id, address, url, secret, delivered_through) VALUES ('whk_behind', 'bob', 'https://example.invalid/', 'x', 0)`)
  await alice.post('/v2/message', { recipient: 'bob', body: 'for the webhook' })
  const [next] = await ids(one)
  await one.post('/v2/events/ack', { upTo: next })
  await purgeExpired(db)
  t.same(await stored(db), [next], 'kept for the webhook behind')
})

t.test('an acknowledgement past the end of the feed covers what is there, not what is still to come', async (t) => {
  const { as } = await build(t)
  const alice = await as('alice')
  const bob = await as('bob')
  await alice.post('/v2/message', { recipient: 'bob', body: 'one' })
  t.equal((await bob.post('/v2/events/ack', { upTo: '999999999' })).statusCode, 204)
  t.same(await ids(bob), [])
  await alice.post('/v2/message', { recipient: 'bob', body: 'two' })
  t.equal((await ids(bob)).length, 1, 'a later event still arrives')
  t.equal((await bob.delete('/v2/events?upTo=999999999')).statusCode, 204)
  await alice.post('/v2/message', { recipient: 'bob', body: 'three' })
  t.equal((await ids(bob)).length, 1, 'after DELETE too')
})
