import t from 'tap'
import { sql } from 'drizzle-orm'
import { queryRows } from '../../../src/db/rows.js'
import { build } from '../../helper.js'

t.test('typing events of both kinds expire 15 s after they are written, on the database clock', async (t) => {
  const { as, db } = await build(t)
  const alice = await as('alice')
  const bob = await as('bob')
  // Typing reaches only users who know the typist (API.md §13): bob lists alice.
  t.equal((await bob.post('/v2/roster', { entity: 'alice' })).statusCode, 200)
  t.equal((await alice.post('/v2/message/typing', { recipient: 'bob' })).statusCode, 204)
  t.equal((await alice.delete('/v2/message/typing/bob')).statusCode, 204)
  const rows = await queryRows<{ type: string, ttl: number }>(db, sql`
    -- expiresAt travels in milliseconds, created_at in microseconds: compare to the millisecond.
    SELECT type, round(extract(epoch FROM expires_at - created_at), 2)::float8 AS ttl FROM events
    WHERE address = 'bob' AND type LIKE 'typing.%' ORDER BY seq`)
  t.same(rows, [{ type: 'typing.started', ttl: 15 }, { type: 'typing.stopped', ttl: 15 }])
})

t.test('typing to a big group is coalesced: 20 calls give one typing.started per member', async (t) => {
  const { as, db } = await build(t, { env: { RATE_LIMIT_PER_SECOND: '100000' } })
  const alice = await as('alice')
  const members = Array.from({ length: 50 }, (_, i) => `m${i}`)
  await db.execute(sql`INSERT INTO users (address) SELECT unnest(${sql.param(members)}::text[])`)
  const group = (await alice.post('/v2/group', { name: 'big', members })).json()
  const count = async () => (await queryRows<{ n: number }>(db, sql`SELECT count(*)::int AS n FROM events WHERE type LIKE 'typing.%'`))[0]!.n

  t.equal((await alice.delete(`/v2/message/typing/${group.id}`)).statusCode, 204)
  t.equal(await count(), 0, 'a stop with no live start sends nothing')
  const answers = []
  for (let i = 0; i < 20; i++) answers.push(await alice.post('/v2/message/typing', { recipient: group.id }))
  t.same(answers.map((r) => r.statusCode), Array(20).fill(204))
  t.equal(await count(), 50, 'one typing.started per other member, not 20')
  t.equal((await alice.delete(`/v2/message/typing/${group.id}`)).statusCode, 204)
  t.equal((await alice.delete(`/v2/message/typing/${group.id}`)).statusCode, 204)
  t.equal(await count(), 100, 'one typing.stopped per member after a live start, once')
  // A start is sent again once the previous one has less than half its TTL to live.
  t.equal((await alice.post('/v2/message/typing', { recipient: group.id })).statusCode, 204)
  t.equal(await count(), 150, 'after a stop, a new start goes out')
})

t.test('typing toggled to a 1,000-member group: 5,000 feeds at once, then 1,000 a second, per sender; 429 with the wait past that', async (t) => {
  let clock = Date.now()
  const { as, db } = await build(t, { now: () => clock, env: { RATE_LIMIT_PER_SECOND: '100000' } })
  const mallory = await as('mallory')
  const members = Array.from({ length: 999 }, (_, i) => `member${i + 1}`)
  await db.execute(sql`INSERT INTO users (address) SELECT unnest(${sql.param(members)}::text[])`)
  const group = (await mallory.post('/v2/group', { name: 'everyone', members })).json().id as string
  const count = async () => (await queryRows<{ n: number }>(db, sql`SELECT count(*)::int AS n FROM events WHERE type LIKE 'typing.%' AND data->>'from' = 'mallory'`))[0]!.n
  // Started and stopped in turn, each a fan-out to 999 feeds: five fit in 5,000.
  const toggle = (i: number) => i % 2 === 0 ? mallory.post('/v2/message/typing', { recipient: group }) : mallory.delete(`/v2/message/typing/${group}`)
  const answers = []
  for (let i = 0; i < 8; i++) answers.push(await toggle(i))
  // The start after a refused stop is the live start's again: coalesced, 204, nothing written.
  t.same(answers.map((r) => r.statusCode), [204, 204, 204, 204, 204, 429, 204, 429])
  t.equal(await count(), 5 * 999, 'five fan-outs written, none of the refused')
  t.equal(answers[5]!.headers['retry-after'], '1')
  t.match(answers[5]!.json(), { code: 'RATE_LIMITED', message: 'Too many requests/second, please try again later' }, 'the contract\'s rate message (SPEC.md §7)')
  // What is left (5,000 - 4,995) goes a feed a call to a user, one that does not know mallory
  // too: a refusal must not tell which users do.
  await as('stranger')
  const toStranger = []
  for (let i = 0; i < 6; i++) toStranger.push((await mallory.post('/v2/message/typing', { recipient: 'stranger' })).statusCode)
  t.same(toStranger, [204, 204, 204, 204, 204, 429], 'typing to a stranger spends as typing to an acquaintance does')
  // Another member's typing has its own allowance.
  const member1 = await as('member1')
  t.equal((await member1.post('/v2/message/typing', { recipient: group })).statusCode, 204, 'another sender types on')
  clock += 1_000
  t.equal((await toggle(5)).statusCode, 204, 'a second later, the refused stop goes')
  t.equal((await toggle(6)).statusCode, 429, 'and only that one')
  clock += 10_000
  t.same([(await toggle(6)).statusCode, (await toggle(7)).statusCode], [204, 204], 'refilled')
  t.equal(await count(), 8 * 999, 'every fan-out answered 204, and no other')
})
