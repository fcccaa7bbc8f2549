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
