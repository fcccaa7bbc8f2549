import t from 'tap'
import { build } from '../helper.js'

const LONE = 'a\ud800b'

t.test('a lone UTF-16 surrogate is refused with 400 naming the field, never a 500 or a silent U+FFFD', async (t) => {
  const { as } = await build(t, { env: { RATE_LIMIT_PER_SECOND: '1000' } })
  const alice = await as('alice')
  await as('bob')
  const group = (await alice.post('/v2/group', { name: 'ops' })).json().id as string
  const cases: [string, () => ReturnType<typeof alice.post>, RegExp][] = [
    ['message body', () => alice.post('/v2/message', { recipient: 'bob', body: LONE }), /body/],
    ['metadata value', () => alice.post('/v2/metadata/alice', { note: LONE }), /note/],
    ['metadata key', () => alice.post('/v2/metadata/alice', { [`k${'\udc00'}`]: 1 }), /metadata|name|key/],
    ['group name', () => alice.post('/v2/group', { name: LONE }), /name/],
    ['group rename', () => alice.post(`/v2/group/${group}`, { name: `x${'\udfff'}` }), /name/],
    ['roster name', () => alice.post('/v2/roster', { entity: 'bob', name: LONE }), /name/],
    ['search query', () => alice.post('/v2/search', { query: LONE }), /query/]
  ]
  for (const [what, call, field] of cases) {
    const res = await call()
    t.equal(res.statusCode, 400, what)
    t.match(res.json(), { code: 'VALIDATION_FAILED', message: field }, what)
  }
  // A well-formed pair (an emoji) is fine.
  t.equal((await alice.post('/v2/message', { recipient: 'bob', body: 'ok \ud83d\ude00' })).statusCode, 200)
  t.equal((await alice.get('/v2/roster')).json().entries.length, 0, 'nothing was stored')
})

t.test('a 1 MiB JSON body of 500,000 array elements costs little CPU to refuse', async (t) => {
  const { as } = await build(t)
  const alice = await as('alice')
  const wide = { a: new Array<number>(499_000).fill(0) }
  t.ok(JSON.stringify(wide).length < 1024 * 1024, 'under the body limit')
  await alice.post('/v2/metadata/alice', { warm: 1 })
  // Measured around the whole request: encoding it here, parsing, validating and refusing it.
  const before = process.cpuUsage()
  const res = await alice.post('/v2/metadata/alice', wide)
  const used = process.cpuUsage(before)
  t.equal(res.statusCode, 400, res.body)
  const ms = (used.user + used.system) / 1000
  // The walk that built a path string per element cost ~600 ms here; parsing alone is ~20 ms.
  t.ok(ms < 250, `CPU for the request: ${ms.toFixed(0)} ms`)
})
