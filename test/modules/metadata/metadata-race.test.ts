import t from 'tap'
import { sql } from 'drizzle-orm'
import { queryRows } from '../../../src/db/rows.js'
import { build } from '../../helper.js'

t.test('two concurrent first writes keep both keys (50 trials), 20 concurrent writers keep all keys', async (t) => {
  const { as } = await build(t, { env: { RATE_LIMIT_PER_SECOND: '100000' } })
  let lost = 0
  for (let trial = 0; trial < 50; trial++) {
    const user = await as(`meta${trial}`)
    const [a, b] = await Promise.all([
      user.post(`/v2/metadata/${user.address}`, { a: 1 }),
      user.post(`/v2/metadata/${user.address}`, { b: 2 })
    ])
    t.equal(a!.statusCode, 200)
    t.equal(b!.statusCode, 200)
    const stored = (await user.get(`/v2/metadata/${user.address}`)).json().metadata
    if (stored.a !== 1 || stored.b !== 2) lost++
  }
  t.equal(lost, 0, 'no trial lost a key')

  const writer = await as('writer')
  const answers = await Promise.all(Array.from({ length: 20 }, (_, i) => writer.post(`/v2/metadata/${writer.address}`, { [`k${i}`]: i })))
  t.same(answers.map((r) => r.statusCode), Array(20).fill(200))
  const stored = (await writer.get(`/v2/metadata/${writer.address}`)).json().metadata
  t.same(Object.keys(stored).sort(), Array.from({ length: 20 }, (_, i) => `k${i}`).sort(), 'all 20 keys kept')
})

t.test('a refused first write leaves no map behind', async (t) => {
  const { as } = await build(t)
  const alice = await as('alice')
  const big = Object.fromEntries(Array.from({ length: 65 }, (_, i) => [`k${i}`, i]))
  t.equal((await alice.post('/v2/metadata/alice', big)).statusCode, 400)
  t.same((await alice.get('/v2/metadata/alice')).json(), { entity: 'alice', metadata: {}, updatedAt: null })
})

t.test('a deleted group takes its metadata with it', async (t) => {
  const { as, db } = await build(t)
  const alice = await as('alice')
  await as('bob')
  const group = (await alice.post('/v2/group', { name: 'g', members: ['bob'] })).json()
  t.equal((await alice.post(`/v2/metadata/${group.id}`, { topic: 'x' })).statusCode, 200)
  t.equal((await alice.delete(`/v2/group/${group.id}`)).statusCode, 204)
  const rows = await queryRows<{ entity: string }>(db, sql`SELECT entity FROM metadata WHERE entity = ${group.id}`)
  t.same(rows, [], 'metadata row gone')
})
