import fc from 'fast-check'
import t from 'tap'
import { createKeysRepository } from '../../../src/modules/keys/keys.repository.js'
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

t.test('every cursor with an impossible date (Feb 30, year 0000) answers 400 naming cursor, on every paged route, never 500', async (t) => {
  const { as, db, callerFor, createUser } = await build(t, { env: { RATE_LIMIT_PER_SECOND: '100000', WEBHOOK_ALLOW_PRIVATE: 'true' } })
  const alice = await as('alice')
  await as('bob')
  const sent = (await alice.post('/v2/message', { recipient: 'bob', body: 'hello there' })).json() as { id: string, createdAt: string }
  await createUser('root')
  const admin = callerFor('root', await createKeysRepository(db).create('root', null, { scopes: ['admin'] }))
  const hook = (await alice.post('/v2/webhooks', { url: 'http://127.0.0.1:9/hook' })).json() as { id: string }
  const times = ['2026-02-30T00:00:00.000Z', '0000-01-01T00:00:00.000Z', '2026-04-31T12:00:00.000Z', '2026-01-01T24:00:00.000Z', '2025-02-29T00:00:00.000Z']
  for (const time of times) {
    const forged = [
      ['GET /v2/conversations', () => alice.get(`/v2/conversations?cursor=${encode([time, sent.id])}`)],
      ['POST /v2/search', () => alice.post('/v2/search', { query: 'hel', types: ['messages'], cursor: encode({ t: 'messages', k: [time, sent.id] }) })],
      ['POST /v2/search with', () => alice.post('/v2/search', { with: 'bob', cursor: encode({ t: 'messages', k: [time, sent.id] }) })],
      ['GET /v2/admin/users', () => admin.get(`/v2/admin/users?cursor=${encode(time)}`)],
      ['GET /v2/webhooks/:id/deliveries', () => alice.get(`/v2/webhooks/${hook.id}/deliveries?cursor=${encodeURIComponent(time)}`)]
    ] as const
    for (const [route, call] of forged) {
      const res = await call()
      t.equal(res.statusCode, 400, `${route} ${time}: ${res.body}`)
      t.match(res.json(), { code: 'VALIDATION_FAILED', message: /cursor/ }, `${route} ${time}`)
    }
  }
  // A leap day that exists, and the times real cursors carry, still page.
  const ok = await alice.get(`/v2/conversations?cursor=${encode(['2024-02-29T00:00:00.000Z', sent.id])}`)
  t.equal(ok.statusCode, 200)
  const real = await alice.post('/v2/search', { query: 'hel', types: ['messages'], cursor: encode({ t: 'messages', k: [sent.createdAt, sent.id] }) })
  t.equal(real.statusCode, 200)
})
