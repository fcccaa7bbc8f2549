import fc from 'fast-check'
import t from 'tap'
import { build } from '../../helper.js'

const encode = (value: unknown) => Buffer.from(JSON.stringify(value)).toString('base64url')

t.test('a forged search cursor answers 400 naming cursor, never 500', async (t) => {
  const { as } = await build(t, { env: { RATE_LIMIT_PER_SECOND: '100000' } })
  const alice = await as('alice')
  await as('bob')
  await alice.post('/v2/message', { recipient: 'bob', body: 'hello there' })
  const known = [
    { t: 'messages', k: ['not-a-date', 'x'] },
    { t: 'messages', k: [] },
    { t: 'messages', k: ['2026-01-01T00:00:00.000Z', 'msg_\u0000'] },
    { t: 'users', k: ['a\u0000b'] },
    { t: 'groups', k: ['ops'] },
    { t: 'messages', k: [1, 2] },
    null, 7, 'messages'
  ]
  for (const cursor of known) {
    const res = await alice.post('/v2/search', { query: 'hel', cursor: encode(cursor) })
    t.equal(res.statusCode, 400, JSON.stringify(cursor))
    t.match(res.json(), { code: 'VALIDATION_FAILED', message: /cursor/ })
  }
  await fc.assert(fc.asyncProperty(
    fc.record({ t: fc.constantFrom('messages', 'users', 'groups', 'other'), k: fc.option(fc.array(fc.oneof(fc.string(), fc.integer(), fc.constant(null)), { maxLength: 3 }), { nil: undefined }) }),
    async (cursor) => {
      const res = await alice.post('/v2/search', { query: 'hel', cursor: encode(cursor) })
      return res.statusCode === 200 || res.statusCode === 400
    }
  ), { numRuns: 150 })
  // A real cursor still pages.
  for (let i = 0; i < 3; i++) await alice.post('/v2/message', { recipient: 'bob', body: `hello ${i}` })
  const first = (await alice.post('/v2/search', { query: 'hel', types: ['messages'], limit: 2 })).json()
  const next = await alice.post('/v2/search', { query: 'hel', types: ['messages'], limit: 2, cursor: first.nextCursor })
  t.equal(next.statusCode, 200)
  t.equal(next.json().results.length, 2)
})
