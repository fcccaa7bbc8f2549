import type { IncomingMessage } from 'node:http'
import type { AddressInfo } from 'node:net'
import { sql } from 'drizzle-orm'
import type { FastifyInstance } from 'fastify'
import pg from 'pg'
import t from 'tap'
import { queryRows } from '../../../src/db/rows.js'
import { openedBody } from '../../../src/modules/messages/message-body.js'
import { build, type Caller } from '../../helper.js'
import { usingPostgres } from '../../support/databases.js'
import { metric } from '../../support/metrics.js'
import { until } from '../../support/until.js'

/**
 * The edges of a send: Idempotency-Key in flight and after deletion, and one clock (the
 * database's) for a message and its events.
 */
const FAST = { RATE_LIMIT_PER_SECOND: '100000' }
const onPostgres = usingPostgres() ? false : 'holding a send open needs a second connection: PostgreSQL only'

async function listening (app: FastifyInstance): Promise<string> {
  await app.listen({ port: 0, host: '127.0.0.1' })
  return `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`
}

function post (base: string, caller: Caller, body: unknown, idempotencyKey: string): Promise<Response> {
  return fetch(`${base}/v2/message`, {
    method: 'POST',
    headers: { authorization: caller.authorization, 'content-type': 'application/json', 'idempotency-key': idempotencyKey },
    body: JSON.stringify(body)
  })
}

/** A second connection to the test's database, in a transaction, closed at teardown. */
async function holder (t: { teardown(fn: () => unknown): void }, url: string): Promise<pg.Client> {
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  t.teardown(() => client.end())
  await client.query('BEGIN')
  return client
}

/** Resolves once some backend waits on a lock (the held send got as far as the held row). */
async function someoneWaits (client: pg.Client): Promise<void> {
  await until(async () => (await client.query<{ n: number }>('SELECT count(*)::int AS n FROM pg_locks WHERE NOT granted')).rows[0]!.n > 0,
    { timeoutMs: 5_000, intervalMs: 10, message: 'no send ever waited on the held lock' })
}

/**
 * Resolves once a send on `app` has given up waiting for a held row (its batch, or its try
 * alone, ran out of lock_timeout) and tries again alone: its Idempotency-Key is then known here
 * as in flight.
 */
async function retryingAlone (app: FastifyInstance): Promise<void> {
  await until(async () => (await metric(app, 'parley_send_recipients_held') ?? 0) > 0, { timeoutMs: 5_000, message: 'no send retried alone for the held row' })
}

/** A promise and whether it has settled yet. */
function watched<T> (promise: Promise<T>): { promise: Promise<T>, settled: () => boolean } {
  let settled = false
  promise.then(() => { settled = true }, () => { settled = true })
  return { promise, settled: () => settled }
}

/** How many requests carrying this Idempotency-Key the app's listener has received. */
function arrivals (app: FastifyInstance, idempotencyKey: string): () => number {
  let n = 0
  app.server.on('request', (req: IncomingMessage) => { if (req.headers['idempotency-key'] === idempotencyKey) n++ })
  return () => n
}

t.test('a duplicate of a send waiting on a held row: 409 at once on its instance; on another, 409 or the original; never 429, nothing written twice', { skip: onPostgres }, async (t) => {
  const built = await build(t, { env: FAST })
  const second = await built.secondInstance()
  const [a, b] = [await listening(built.app), await listening(second)]
  // One unit of quota left: the duplicate must not be refused for the first send's unit.
  const alice = await built.as('alice', { dailyQuota: 1 })
  await built.createUser('bob')
  const hold = await holder(t, built.url!)
  // The send locks bob's user row for his feed id: hold it, and the first send waits for it,
  // trying again and again (a send waits at most 50 ms a try for a lock), holding nothing between.
  await hold.query("SELECT 1 FROM users WHERE address = 'bob' FOR UPDATE")
  const first = post(a, alice, { recipient: 'bob', body: 'once' }, 'k-1')
  await someoneWaits(hold)
  await retryingAlone(built.app)
  const started = Date.now()
  const here = await post(a, alice, { recipient: 'bob', body: 'once' }, 'k-1')
  t.ok(Date.now() - started < 1_000, `the duplicate on the same instance was answered while the first waited (${Date.now() - started} ms)`)
  t.equal(here.status, 409)
  t.match(await here.json(), { statusCode: 409, code: 'IDEMPOTENCY_IN_PROGRESS', message: /k-1/ })
  // In flight on the other instance before the row comes free: answered already (409), or
  // trying alone for the row itself there, with the key's lock between its tries.
  const there = watched(post(b, alice, { recipient: 'bob', body: 'once' }, 'k-1'))
  await until(async () => there.settled() || (await metric(second, 'parley_send_recipients_held') ?? 0) > 0,
    { timeoutMs: 5_000, message: 'the duplicate on the other instance was neither answered nor waiting for the row' })
  await hold.query('COMMIT')
  const original = await first
  t.equal(original.status, 200)
  const sent = await original.json() as { id: string }
  const dup = await there.promise
  const dupBody = await dup.json() as { id?: string, code?: string }
  t.ok(dup.status === 409 || (dup.status === 200 && dupBody.id === sent.id), `the duplicate on another instance: ${dup.status} ${dupBody.code ?? dupBody.id}, 409 or the original`)
  const retry = await post(b, alice, { recipient: 'bob', body: 'once' }, 'k-1')
  t.equal(retry.status, 200, 'once the first committed, a retry is the replay')
  t.equal((await retry.json() as { id: string }).id, sent.id)
  t.equal(retry.headers.get('idempotent-replayed'), 'true')
  const [row] = await queryRows<{ messages: number, quota: number }>(built.db, sql`SELECT (SELECT count(*) FROM messages)::int AS messages, (SELECT count FROM quota_usage) AS quota`)
  t.same(row, { messages: 1, quota: 1 })
})

t.test('a duplicate of a send whose batch failed on a held row, while the send waits its turn to retry alone: the original is what is sent, the duplicate 409 or 422', { skip: onPostgres }, async (t) => {
  const built = await build(t, { env: FAST })
  const base = await listening(built.app)
  const alice = await built.as('alice')
  await built.createUser('bob')
  const hold = await holder(t, built.url!)
  await hold.query("SELECT 1 FROM users WHERE address = 'bob' FOR UPDATE")
  const plain = (body: string) => fetch(`${base}/v2/message`, {
    method: 'POST', headers: { authorization: alice.authorization, 'content-type': 'application/json' }, body: JSON.stringify({ recipient: 'bob', body })
  })
  // One batch: four sends, then the keyed one. When the batch gives up on bob's row, its sends
  // retry alone one after another (~50 ms a try), the keyed one last.
  const keyed = arrivals(built.app, 'k-2')
  const others = [1, 2, 3, 4].map((n) => plain(`other ${n}`))
  const first = post(base, alice, { recipient: 'bob', body: 'one' }, 'k-2')
  await someoneWaits(hold)
  // The batch has given up on the row: its sends retry alone, the keyed one waits its turn.
  await retryingAlone(built.app)
  const duplicate = post(base, alice, { recipient: 'bob', body: 'two' }, 'k-2')
  // Made before the row comes free: the server has it (answered, or queued behind its key's sends).
  await until(() => keyed() === 2, { timeoutMs: 5_000, message: 'the duplicate never reached the server' })
  await hold.query('COMMIT')
  const original = await first
  t.equal(original.status, 200)
  const sent = await original.json() as { id: string, body: string }
  t.equal(sent.body, 'one', 'the original request is the one sent')
  const dup = await duplicate
  // Made while the original was in flight: 409 at once, or, once the original committed, 422
  // (its fields differ); never sent in the original's place.
  t.ok(dup.status === 409 || dup.status === 422, `the duplicate: 409 or 422 (${dup.status})`)
  for (const res of await Promise.all(others)) t.equal(res.status, 200)
  // Bodies are sealed at rest (API.md §11): opened as the service reads them.
  const rows = await queryRows<{ id: string, body: string, sealed_by: string | null }>(built.db, sql`SELECT id, body, sealed_by FROM messages`)
  t.same(rows.map((r) => openedBody({ id: r.id, body: r.body, sealedBy: r.sealed_by })).sort(), ['one', 'other 1', 'other 2', 'other 3', 'other 4'])
})

t.test('concurrent duplicates with one unit of quota left: each gets the original or 409, never 429', async (t) => {
  const { as, createUser, db } = await build(t, { env: FAST })
  const alice = await as('alice', { dailyQuota: 1 })
  await createUser('bob')
  const answers = await Promise.all(Array.from({ length: 8 }, () =>
    alice.post('/v2/message', { recipient: 'bob', body: 'once' }, { headers: { 'idempotency-key': 'last-unit' } })))
  const codes = answers.map((a) => a.statusCode)
  t.ok(codes.every((c) => c === 200 || c === 409), `answers: ${codes.join(' ')}`)
  t.equal(new Set(answers.filter((a) => a.statusCode === 200).map((a) => a.json().id)).size, 1, 'one message id')
  const [row] = await queryRows<{ messages: number }>(db, sql`SELECT count(*)::int AS messages FROM messages`)
  t.equal(row!.messages, 1)
})

t.test('a retry of a finished send finding its key\'s lock taken (another retry replaying) gets the original or 422, never 409', { skip: onPostgres }, async (t) => {
  const built = await build(t, { env: FAST })
  const alice = await built.as('alice')
  await built.createUser('bob')
  const headers = { 'idempotency-key': 'done-1' }
  const first = await alice.post('/v2/message', { recipient: 'bob', body: 'once' }, { headers })
  t.equal(first.statusCode, 200)
  // Another retry of the same key holds its lock, as its replay does for a moment: nothing is in flight.
  const hold = await holder(t, built.url!)
  await hold.query('SELECT pg_advisory_xact_lock(hashtextextended($1, $2::bigint))', [`${alice.keyId} done-1`, 0x1de])
  const same = await alice.post('/v2/message', { recipient: 'bob', body: 'once' }, { headers })
  t.equal(same.statusCode, 200, same.body)
  t.equal(same.json().id, first.json().id)
  t.equal(same.headers['idempotent-replayed'], 'true')
  const other = await alice.post('/v2/message', { recipient: 'bob', body: 'twice' }, { headers })
  t.equal(other.statusCode, 422, other.body)
  t.match(other.json(), { code: 'IDEMPOTENCY_MISMATCH', message: /done-1/ })
  // A key no send has finished, its lock taken: that one really is in flight.
  await hold.query('SELECT pg_advisory_xact_lock(hashtextextended($1, $2::bigint))', [`${alice.keyId} fresh`, 0x1de])
  const inFlight = await alice.post('/v2/message', { recipient: 'bob', body: 'new' }, { headers: { 'idempotency-key': 'fresh' } })
  t.equal(inFlight.statusCode, 409)
  t.match(inFlight.json(), { code: 'IDEMPOTENCY_IN_PROGRESS' })
  await hold.query('COMMIT')
  const [row] = await queryRows<{ messages: number, quota: number }>(built.db, sql`SELECT (SELECT count(*) FROM messages)::int AS messages, (SELECT count FROM quota_usage) AS quota`)
  t.same(row, { messages: 1, quota: 1 })
})

t.test('60 concurrent retries of a finished send on two instances: the original to each same one, 422 to each changed one, no 409', async (t) => {
  const built = await build(t, { env: FAST })
  const second = await built.secondInstance()
  const [a, b] = [await listening(built.app), await listening(second)]
  const alice = await built.as('alice')
  await built.createUser('bob')
  const first = await post(a, alice, { recipient: 'bob', body: 'once' }, 'burst-done')
  t.equal(first.status, 200)
  const { id } = await first.json() as { id: string }
  const answers = await Promise.all(Array.from({ length: 60 }, async (_, i) => {
    const res = await post(i % 2 === 0 ? a : b, alice, { recipient: 'bob', body: i % 3 === 0 ? 'changed' : 'once' }, 'burst-done')
    return { changed: i % 3 === 0, status: res.status, body: await res.json() as { id?: string, code?: string } }
  }))
  const wrong = answers.filter((x) => x.changed ? x.status !== 422 : x.status !== 200 || x.body.id !== id)
  t.same(wrong.map((x) => `${x.changed ? 'changed' : 'same'} ${x.status} ${x.body.code ?? ''}`), [], 'every retry answered as a finished send')
  const [row] = await queryRows<{ messages: number, quota: number }>(built.db, sql`SELECT (SELECT count(*) FROM messages)::int AS messages, (SELECT count FROM quota_usage) AS quota`)
  t.same(row, { messages: 1, quota: 1 })
})

t.test('a retry after the sender deleted the message answers 404, sends nothing and counts no quota', async (t) => {
  const { as, createUser, db } = await build(t, { env: FAST })
  const alice = await as('alice')
  await createUser('bob')
  const headers = { 'idempotency-key': 'pay-7' }
  const first = await alice.post('/v2/message', { recipient: 'bob', body: 'pay 7' }, { headers })
  t.equal(first.statusCode, 200)
  const id = first.json().id as string
  t.equal((await alice.delete(`/v2/message/${id}`)).statusCode, 204)
  const retry = await alice.post('/v2/message', { recipient: 'bob', body: 'pay 7' }, { headers })
  t.equal(retry.statusCode, 404)
  t.same(retry.json(), { statusCode: 404, error: 'Not Found', code: 'NOT_FOUND', message: `message ${id} sent with this Idempotency-Key was deleted` })
  const changed = await alice.post('/v2/message', { recipient: 'bob', body: 'pay 700' }, { headers })
  t.equal(changed.statusCode, 422, 'other fields are still a mismatch')
  const [row] = await queryRows<{ messages: number, quota: number }>(db, sql`SELECT (SELECT count(*) FROM messages)::int AS messages, (SELECT count FROM quota_usage) AS quota`)
  t.same(row, { messages: 0, quota: 1 }, 'no second message, one unit counted')
  const other = await alice.post('/v2/message', { recipient: 'bob', body: 'pay 7' }, { headers: { 'idempotency-key': 'pay-8' } })
  t.equal(other.statusCode, 200, 'another key sends')
})

interface FeedEvent { type: string, createdAt: string, data: { message?: { id: string, createdAt: string } } }

async function feed (caller: Caller): Promise<FeedEvent[]> {
  return (await caller.get('/v2/events?limit=200')).json().events as FeedEvent[]
}

t.test('a message, its answer and its events carry one time: the database\'s', async (t) => {
  const { as, db } = await build(t, { env: FAST })
  const alice = await as('alice')
  const bob = await as('bob')
  const before = (await queryRows<{ now: string }>(db, sql`SELECT now()::text AS now`))[0]!.now
  const sent = await alice.post('/v2/message', { recipient: 'bob', body: 'tick' })
  const after = (await queryRows<{ now: string }>(db, sql`SELECT now()::text AS now`))[0]!.now
  const message = sent.json() as { id: string, createdAt: string }
  const at = Date.parse(message.createdAt)
  t.ok(at >= Math.floor(Date.parse(before)) - 1 && at <= Date.parse(after) + 1, 'between the database\'s clock before and after')
  t.equal((await alice.get(`/v2/message/${message.id}`)).json().createdAt, message.createdAt, 'read back')
  const [event] = (await feed(bob)).filter((e) => e.type === 'message.received')
  t.equal(event?.data.message?.createdAt, message.createdAt, 'in the event\'s message')
  t.equal(event?.createdAt, message.createdAt, 'the event\'s own time')
})

t.test('a group send held up in its transaction still has one time for the message and its events', { skip: onPostgres }, async (t) => {
  const built = await build(t, { env: FAST })
  const alice = await built.as('alice')
  const bob = await built.as('bob')
  await built.as('carol')
  const group = (await alice.post('/v2/group', { name: 'g', members: ['bob', 'carol'] })).json().id as string
  const hold = await holder(t, built.url!)
  await hold.query('SELECT 1 FROM groups WHERE id = $1 FOR UPDATE', [group])
  // The send's transaction starts (its now()), then waits for the group: the app's clock has
  // moved on by the time the message is written.
  const sending = alice.post('/v2/message', { recipient: group, body: 'late' })
  await someoneWaits(hold)
  // Held up a while: any time read before the wait then differs, to the millisecond, from one
  // read after it. The database's clock and the send's own are not ones a test can move.
  await new Promise((resolve) => setTimeout(resolve, 300))
  await hold.query('COMMIT')
  const message = (await sending).json() as { id: string, createdAt: string }
  const received = (await feed(bob)).filter((e) => e.type === 'message.received')
  t.equal(received.length, 1)
  t.equal(received[0]!.data.message?.createdAt, message.createdAt)
  t.equal(received[0]!.createdAt, message.createdAt)
  t.equal((await alice.get(`/v2/message/${message.id}`)).json().createdAt, message.createdAt)
})

t.test('the test bot\'s reply has one time too', async (t) => {
  const { as } = await build(t, { env: FAST })
  const alice = await as('alice')
  t.equal((await alice.post('/v2/message', { recipient: 'testbot', body: 'ping' })).statusCode, 200)
  let reply: FeedEvent | undefined
  await until(async () => (reply = (await feed(alice)).find((e) => e.type === 'message.received')) !== undefined,
    { timeoutMs: 5_000, intervalMs: 50, message: 'the bot never answered' })
  t.ok(reply, 'the bot answered')
  t.equal(reply!.data.message?.createdAt, reply!.createdAt)
  t.equal((await alice.get(`/v2/message/${reply!.data.message!.id}`)).json().createdAt, reply!.createdAt)
})
