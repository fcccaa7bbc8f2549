import type { AddressInfo } from 'node:net'
import { sql } from 'drizzle-orm'
import type { FastifyInstance } from 'fastify'
import t from 'tap'
import { queryRows } from '../../../src/db/rows.js'
import { build, type Caller } from '../../helper.js'

/** Deletion leaves nothing behind, and says so once. */
const FAST = { RATE_LIMIT_PER_SECOND: '100000' }

interface FeedEvent { type: string, data: { message?: unknown } }

async function feed (caller: Caller): Promise<FeedEvent[]> {
  return (await caller.get('/v2/events?limit=200')).json().events as FeedEvent[]
}

async function listening (app: FastifyInstance): Promise<string> {
  await app.listen({ port: 0, host: '127.0.0.1' })
  return `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`
}

t.test('a recipient hiding a message erases its own feed\'s copy of the body, and only its own', async (t) => {
  const { as, db } = await build(t, { env: FAST })
  const alice = await as('alice')
  const bob = await as('bob')
  const carol = await as('carol')
  const group = (await alice.post('/v2/group', { name: 'g', members: ['bob', 'carol'] })).json().id as string
  const id = (await alice.post('/v2/message', { recipient: group, body: 'secret plan' })).json().id as string
  t.equal((await bob.delete(`/v2/message/${id}`)).statusCode, 204)
  t.equal((await bob.get(`/v2/message/${id}`)).statusCode, 404, 'hidden from bob')
  t.notOk((await feed(bob)).some((e) => e.type === 'message.received'), 'bob\'s feed no longer carries it')
  const [stored] = await queryRows<{ n: number }>(db, sql`SELECT count(*)::int AS n FROM events WHERE address = 'bob' AND data::text LIKE '%secret plan%'`)
  t.equal(stored!.n, 0, 'nor does the database')
  t.equal((await feed(carol)).filter((e) => e.type === 'message.received').length, 1, 'carol still has hers')
  t.equal((await carol.get(`/v2/message/${id}`)).statusCode, 200)
})

t.test('ten concurrent deletes of one message: 204 or 404 each, one message.deleted per recipient', async (t) => {
  const built = await build(t, { env: FAST })
  const second = await built.secondInstance()
  const bases = [await listening(built.app), await listening(second)]
  const alice = await built.as('alice')
  const bob = await built.as('bob')
  const carol = await built.as('carol')
  const group = (await alice.post('/v2/group', { name: 'g', members: ['bob', 'carol'] })).json().id as string
  const id = (await alice.post('/v2/message', { recipient: group, body: 'gone soon' })).json().id as string
  const answers = await Promise.all(Array.from({ length: 10 }, (_, i) =>
    fetch(`${bases[i % 2]}/v2/message/${id}`, { method: 'DELETE', headers: { authorization: alice.authorization } })))
  const codes = answers.map((a) => a.status)
  t.ok(codes.every((c) => c === 204 || c === 404), `answers: ${codes.join(' ')}`)
  t.ok(codes.includes(204), 'one delete did it')
  for (const caller of [bob, carol]) {
    const events = await feed(caller)
    t.equal(events.filter((e) => e.type === 'message.deleted').length, 1, `one message.deleted for ${caller.address}`)
    t.equal(events.filter((e) => e.type === 'message.received').length, 0, `no copy of the body for ${caller.address}`)
  }
  t.equal((await alice.get(`/v2/message/${id}`)).statusCode, 404)
})

t.test('deleting a message for everyone deletes its metadata in the same transaction', async (t) => {
  const { as, db } = await build(t, { env: FAST })
  const alice = await as('alice')
  await as('bob')
  const id = (await alice.post('/v2/message', { recipient: 'bob', body: 'tagged' })).json().id as string
  t.equal((await alice.post(`/v2/metadata/${id}`, { label: 'secret-plan' })).statusCode, 200)
  t.equal((await alice.delete(`/v2/message/${id}`)).statusCode, 204)
  const left = await queryRows<{ n: number }>(db, sql`SELECT count(*)::int AS n FROM metadata WHERE entity = ${id}`)
  t.equal(left[0]?.n, 0, 'no metadata outlives its message')
})
