import t from 'tap'
import { sql } from 'drizzle-orm'
import { build } from '../helper.js'

const p99 = (values: number[]): number => [...values].sort((a, b) => a - b)[Math.ceil(values.length * 0.99) - 1]!

t.test('20 concurrent creates of 1,000-member groups: no 5xx, and a bystander keeps sending quickly', async (t) => {
  const built = await build(t, { env: { RATE_LIMIT_PER_SECOND: '100000', DAILY_MESSAGE_QUOTA: '100000' } })
  const members = Array.from({ length: 999 }, (_, i) => `member${i}`)
  await built.db.execute(sql`INSERT INTO users (address) SELECT unnest(${sql.param(members)}::text[])`)
  const owner = await built.as('owner')
  const bystander = await built.as('bystander')
  await built.as('friend')
  const base = await built.app.listen({ host: '127.0.0.1', port: 0 })
  const call = async (authorization: string, body: unknown) => {
    const started = performance.now()
    const res = await fetch(`${base}/v2/${body !== null && typeof body === 'object' && 'name' in body ? 'group' : 'message'}`, {
      method: 'POST', headers: { authorization, 'content-type': 'application/json' }, body: JSON.stringify(body)
    })
    await res.arrayBuffer()
    return { status: res.status, ms: performance.now() - started }
  }
  // The bystander's baseline, alone.
  for (let i = 0; i < 5; i++) await call(bystander.authorization, { recipient: 'friend', body: 'warm-up' })
  const alone: number[] = []
  for (let i = 0; i < 20; i++) alone.push((await call(bystander.authorization, { recipient: 'friend', body: 'alone' })).ms)

  let creating = true
  const creates = Promise.all(Array.from({ length: 20 }, (_, i) => call(owner.authorization, { name: `big ${i}`, members })))
    .finally(() => { creating = false })
  const sends: { status: number, ms: number }[] = []
  while (creating) sends.push(await call(bystander.authorization, { recipient: 'friend', body: 'hi' }))
  const created = await creates
  t.same(created.map((r) => r.status), Array(20).fill(200), 'every create answered 200 (no 503)')
  t.comment(`20 creates: slowest ${Math.max(...created.map((r) => r.ms)).toFixed(0)} ms; bystander p99 ${p99(sends.map((r) => r.ms)).toFixed(0)} ms over ${sends.length} sends`)
  t.ok(sends.length > 0)
  t.ok(sends.every((r) => r.status === 200), 'bystander sends all 200')
  // The embedded database is one connection: the bystander's send queues behind the creates
  // there (each writes 1,000 events). The latency bound is PostgreSQL's, where creates no longer
  // hold the pool; on PGlite only correctness is asserted (a known limit, docs/security.md).
  // Relative to the bystander alone on this machine now (a busy machine slows both), at least
  // 500 ms, at most 1.5 s: a send waiting behind the creates (seconds each) still fails it.
  const bound = Math.min(1500, Math.max(500, 8 * p99(alone)))
  if (built.url !== undefined) t.ok(p99(sends.map((r) => r.ms)) < bound, `bystander p99 < ${bound.toFixed(0)} ms (alone ${p99(alone).toFixed(0)} ms)`)
})

t.test('MAX_GROUP_MEMBERS bounds create and add (owner included) with a 400 naming members', async (t) => {
  const { as } = await build(t, { env: { MAX_GROUP_MEMBERS: '3' } })
  const alice = await as('alice')
  for (const u of ['bob', 'carol', 'dave']) await as(u)
  const tooMany = await alice.post('/v2/group', { name: 'g', members: ['bob', 'carol', 'dave'] })
  t.equal(tooMany.statusCode, 400)
  t.match(tooMany.json(), { statusCode: 400, message: /^members: .*at most 3/ })
  const group = await alice.post('/v2/group', { name: 'g', members: ['bob', 'carol'] })
  t.equal(group.statusCode, 200)
  const add = await alice.post(`/v2/group/${group.json().id}/members`, { members: ['dave'] })
  t.equal(add.statusCode, 400)
  t.match(add.json(), { message: /^members: / })
  const unknown = await alice.post('/v2/group', { name: 'g', members: ['nobody', 'zed'] })
  t.equal(unknown.statusCode, 404)
  t.match(unknown.json(), { message: 'user nobody not found' })
})
