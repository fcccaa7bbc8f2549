import { sql } from 'drizzle-orm'
import t from 'tap'
import { queryRows } from '../../../src/db/rows.js'
import { build } from '../../helper.js'

t.test('roster: add users and groups, rename by adding again, list, remove', async (t) => {
  const { as } = await build(t)
  const alice = await as('alice')
  const bob = await as('bob')
  await as('carol')
  const group = (await bob.post('/v2/group', { name: 'g', members: ['alice'] })).json()

  t.same((await alice.get('/v2/roster')).json(), { entries: [], nextCursor: null })
  const added = await alice.post('/v2/roster', { entity: 'Bob', name: 'Bobby' })
  t.equal(added.statusCode, 200)
  t.match(added.json(), { entity: 'bob', type: 'user', name: 'Bobby', addedAt: /Z$/ })
  t.match((await alice.post('/v2/roster', { entity: group.id }, { format: 'form' })).json(), { entity: group.id, type: 'group', name: null })
  t.match((await alice.post('/v2/roster', { entity: 'carol' }, { format: 'form' })).json(), { entity: 'carol', name: null })
  const renamed = await alice.post('/v2/roster', { entity: 'bob', name: 'Robert' })
  t.match(renamed.json(), { entity: 'bob', name: 'Robert', addedAt: added.json().addedAt })
  t.match((await alice.post('/v2/roster', { entity: 'bob' })).json(), { name: 'Robert' }, 'adding again without a name keeps it')
  const list = (await alice.get('/v2/roster')).json().entries
  t.same(list.map((e: { entity: string }) => e.entity), ['bob', group.id, 'carol'])
  t.same((await bob.get('/v2/roster')).json().entries, [], 'each caller has its own roster')

  t.equal((await alice.delete('/v2/roster/carol')).statusCode, 204)
  t.match((await alice.delete('/v2/roster/carol')).json(), { statusCode: 404, message: 'roster entry carol not found' })
  t.same((await alice.get('/v2/roster')).json().entries.map((e: { entity: string }) => e.entity), ['bob', group.id])
})

t.test('roster: unknown entities 404, groups the caller cannot see 403, messages 400', async (t) => {
  const { as } = await build(t)
  const alice = await as('alice')
  const bob = await as('bob')
  const secret = (await bob.post('/v2/group', { name: 'private' })).json()
  t.match((await alice.post('/v2/roster', { entity: 'nobody' })).json(), { statusCode: 404, message: 'user nobody not found' })
  t.match((await alice.post('/v2/roster', { entity: secret.id })).json(), { statusCode: 403, code: 'FORBIDDEN' })
  t.match((await alice.post('/v2/roster', { entity: 'grp_00000000000000000000000000' })).json(), { statusCode: 404 })
  const message = (await bob.post('/v2/message', { recipient: 'alice', body: 'x' })).json()
  t.match((await alice.post('/v2/roster', { entity: message.id })).json(), { statusCode: 400, message: /entity/ })
  t.match((await alice.post('/v2/roster', { entity: 'bad entity!' })).json(), { statusCode: 400, message: /entity/ })
  t.match((await alice.post('/v2/roster', { name: 'x' })).json(), { statusCode: 400, message: /entity/ })
})

t.test('GET /v2/roster pages: 50 by default, limit 1-200, an opaque cursor, every entry once in order; a forged cursor 400', async (t) => {
  const { as, db } = await build(t, { env: { RATE_LIMIT_PER_SECOND: '100000' } })
  const alice = await as('alice')
  // 130 entries, many added at the same millisecond: the cursor must break ties by entity.
  await queryRows(db, sql`INSERT INTO users (address) SELECT 'u' || lpad(n::text, 3, '0') FROM generate_series(1, 130) AS n`)
  await queryRows(db, sql`INSERT INTO roster_entries (owner, entity, type, added_at)
    SELECT 'alice', 'u' || lpad(n::text, 3, '0'), 'user', '2026-01-01T00:00:00.000Z'::timestamptz + make_interval(secs => (n % 4))
    FROM generate_series(1, 130) AS n`)
  const expected = (await queryRows<{ entity: string }>(db, sql`SELECT entity FROM roster_entries WHERE owner = 'alice' ORDER BY added_at, entity`)).map((r) => r.entity)

  const first = await alice.get('/v2/roster')
  t.equal(first.statusCode, 200)
  t.equal(first.json().entries.length, 50, 'a client that passes nothing gets the first page of 50')
  t.type(first.json().nextCursor, 'string')
  t.same(first.json().entries.map((e: { entity: string }) => e.entity), expected.slice(0, 50))

  for (const limit of [1, 7, 50, 200]) {
    const seen: string[] = []
    let cursor: string | null = null
    for (let pages = 0; pages < 200; pages++) {
      const res = await alice.get(`/v2/roster?limit=${limit}${cursor === null ? '' : `&cursor=${cursor}`}`)
      t.equal(res.statusCode, 200)
      const page = res.json() as { entries: { entity: string }[], nextCursor: string | null }
      t.ok(page.entries.length <= limit)
      seen.push(...page.entries.map((e) => e.entity))
      cursor = page.nextCursor
      if (cursor === null) break
    }
    t.same(seen, expected, `limit ${limit}: every entry once, in order`)
  }
  for (const bad of ['0', '201', 'x']) {
    const res = await alice.get(`/v2/roster?limit=${bad}`)
    t.equal(res.statusCode, 400, `limit=${bad}`)
    t.match(res.json(), { code: 'VALIDATION_FAILED', message: /limit/ })
  }
  const encode = (value: unknown) => Buffer.from(JSON.stringify(value)).toString('base64url')
  for (const cursor of [encode(['2026-02-30T00:00:00.000Z', 'u001']), encode(['2026-01-01T00:00:00.000Z', 'Not An Entity!']), 'garbage', encode([1, 2])]) {
    const res = await alice.get(`/v2/roster?cursor=${cursor}`)
    t.equal(res.statusCode, 400, cursor)
    t.match(res.json(), { code: 'VALIDATION_FAILED', message: /cursor/ })
  }
})
