import { setTimeout as sleep } from 'node:timers/promises'
import { sql } from 'drizzle-orm'
import t, { type Test } from 'tap'
import { queryRows } from '../../src/db/rows.js'
import { build } from '../helper.js'
import { usingPostgres } from '../support/databases.js'
import { p99, relativeBound, sendLoop, sendLoops } from '../support/bystander.js'

// A 1,000-member group renamed again and again. group.updated carries the group without its
// member list (API.md §13), so each rename writes 1,000 small events, not 1,000 copies of 1,000
// addresses (~15 MB a rename); and sends beside it, to its members and between users outside
// it, keep their latency.
const ENV = { RATE_LIMIT_PER_SECOND: '100000', DAILY_MESSAGE_QUOTA: '100000' }
const CEILING_MS = 1_000
const FLOOR_MS = 500

async function bigGroup (t: Test) {
  const built = await build(t, { env: ENV })
  await built.db.execute(sql`INSERT INTO users (address) SELECT 'member' || g FROM generate_series(1, 999) g`)
  const owner = await built.as('owner')
  const created = await owner.post('/v2/group', { name: 'everyone', members: Array.from({ length: 999 }, (_, i) => `member${i + 1}`) })
  t.equal(created.statusCode, 200)
  return { ...built, owner, group: created.json() as { id: string } }
}

t.test('group.created and group.updated of a 1,000-member group carry no member list', async (t) => {
  const { owner, group, db } = await bigGroup(t)
  t.equal((await owner.post(`/v2/group/${group.id}`, { name: 'renamed' })).statusCode, 200)
  const sizes = await queryRows<{ type: string, n: number, biggest: number }>(db, sql`
    SELECT type, count(*)::int AS n, max(octet_length(data::text))::int AS biggest FROM events
    WHERE type IN ('group.created', 'group.updated') GROUP BY type ORDER BY type`)
  t.match(sizes, [{ type: 'group.created', n: 1000 }, { type: 'group.updated', n: 1000 }], 'one event per member')
  t.ok(sizes.every((s) => s.biggest < 300), `each event small: ${sizes.map((s) => `${s.type} ${s.biggest} B`).join(', ')}`)
  const [event] = (await owner.get('/v2/events?limit=1000')).json().events.filter((e: { type: string }) => e.type === 'group.updated')
  t.same(Object.keys(event.data.group).sort(), ['createdAt', 'id', 'memberCount', 'name', 'owner'])
  t.match(event.data.group, { id: group.id, name: 'renamed', owner: 'owner', memberCount: 1000 })
  t.same((await owner.get(`/v2/group/${group.id}`)).json().members.length, 1000, 'GET /group/{id} gives the members')
})

t.test('renaming a 1,000-member group in a loop leaves sends beside it alone', {
  skip: usingPostgres() ? false : 'PostgreSQL only: the embedded database is one connection, where every request takes its turn (docs/security.md)'
}, async (t) => {
  const { owner, group, app, as, createUser } = await bigGroup(t)
  const base = await app.listen({ host: '127.0.0.1', port: 0 })
  // Bystanders outside the group, sending to each other; others sending to its members.
  const outside = await Promise.all(['ann', 'ben', 'cat'].map((a) => as(a)))
  for (const a of ['dan', 'eve', 'fay']) await createUser(a)
  const toMembers = await Promise.all(['gus', 'hal'].map((a) => as(a)))
  const loops = () => sendLoops(outside.map((c, i) => sendLoop([base], c.authorization, [['dan', 'eve', 'fay'][i]!])))
  await loops().stop()
  let watch = loops()
  await sleep(1_500)
  const alone = await watch.stop()

  watch = loops()
  const memberSends = sendLoops(toMembers.map((c, i) => sendLoop([base], c.authorization, Array.from({ length: 50 }, (_, j) => `member${i * 50 + j + 1}`))))
  const renames: number[] = []
  const until = performance.now() + 5_000
  while (performance.now() < until) {
    const res = await fetch(`${base}/v2/group/${group.id}`, {
      method: 'POST', headers: { authorization: owner.authorization, 'content-type': 'application/json' }, body: JSON.stringify({ name: `name ${renames.length}` })
    })
    await res.arrayBuffer()
    renames.push(res.status)
    // A rename every ~100 ms: what is measured is the locks a rename holds and what it writes,
    // not two cores saturated by back-to-back renames of 1,000 events each.
    await sleep(100)
  }
  const during = await watch.stop()
  const members = await memberSends.stop()

  const aloneP99 = p99(alone.map((r) => r.ms))
  const duringP99 = p99(during.map((r) => r.ms))
  // At least FLOOR_MS: measured alone at 46 ms, the bystander's p99 came to 273 ms beside
  // another test file's load in CI (a floor of 250 failed it); the member lists this guards
  // against wrote ~15 MB a rename.
  const bound = relativeBound(aloneP99, CEILING_MS, 5, FLOOR_MS)
  t.comment(`1:1 outside the group: alone p99 ${aloneP99.toFixed(0)} ms; during ${renames.length} renames p99 ${duringP99.toFixed(0)} ms (${during.length} sends), bound ${bound.toFixed(0)} ms; sends to members p99 ${p99(members.map((r) => r.ms)).toFixed(0)} ms (${members.length})`)
  t.ok(renames.length >= 3 && renames.every((s) => s === 200), `${renames.length} renames, each 200`)
  t.same([...new Set([...during, ...members].map((r) => r.status))], [200], 'every send answered 200')
  t.ok(duringP99 < bound, `bystander p99 ${duringP99.toFixed(0)} ms < ${bound.toFixed(0)} ms`)
  t.ok(p99(members.map((r) => r.ms)) < CEILING_MS, `sends to the group's members p99 < ${CEILING_MS} ms`)
})
