import { sql } from 'drizzle-orm'
import pg from 'pg'
import t from 'tap'
import { queryRows } from '../../src/db/rows.js'
import { build } from '../helper.js'
import { usingPostgres } from '../support/databases.js'

// Sends and deletes meet serialization failures (40001) and deadlocks (40P01) that are no
// client's fault: run again, never a 500. Provoked without a trigger: the database's default
// isolation set to REPEATABLE READ (as an operator or a pooler's settings may), under which
// concurrent sends to one user, and deletes beside them, each update that user's feed row and
// all but the first to commit fail with 40001. PostgreSQL only: the embedded database is one
// connection, so its transactions never overlap.
const skip = usingPostgres() ? false : 'PostgreSQL only: the embedded database runs one transaction at a time'
const ENV = { RATE_LIMIT_PER_SECOND: '100000', DAILY_MESSAGE_QUOTA: '100000' }

t.test('sends and deletes under serialization failures all answer 2xx', { skip }, async (t) => {
  const built = await build(t, { env: ENV })
  const name = new URL(built.url!).pathname.slice(1)
  await built.db.execute(sql.raw(`ALTER DATABASE "${name}" SET default_transaction_isolation = 'repeatable read'`))
  // A second instance: a pool of its own, whose connections start with the new default.
  const other = await built.secondInstance()
  const base = await other.listen({ host: '127.0.0.1', port: 0 })
  const senders = await Promise.all(Array.from({ length: 8 }, (_, i) => built.as(`sender${i}`)))
  await built.createUser('bob')
  const call = async (method: string, path: string, authorization: string, body?: unknown) => {
    const res = await fetch(`${base}${path}`, {
      method, headers: { authorization, ...(body === undefined ? {} : { 'content-type': 'application/json' }) }, ...(body === undefined ? {} : { body: JSON.stringify(body) })
    })
    const text = await res.text()
    if (res.status >= 300) t.comment(`${method} ${path}: ${res.status} ${text}`)
    return { status: res.status, json: () => JSON.parse(text) as { id: string } }
  }
  const [before] = await queryRows<{ rollbacks: number }>(built.db, sql`SELECT xact_rollback::int AS rollbacks FROM pg_stat_database WHERE datname = current_database()`)
  const statuses: number[] = []
  for (let round = 0; round < 4; round++) {
    const sent = await Promise.all(senders.flatMap((s) => [0, 1, 2].map((i) => call('POST', '/v2/message', s.authorization, { recipient: 'bob', body: `r${round} ${i}` }).then((r) => ({ s, r })))))
    statuses.push(...sent.map(({ r }) => r.status))
    // Every other message deleted by its sender (message.deleted to bob's feed) while more sends to bob go.
    const deletes = sent.filter((_, i) => i % 2 === 0 && sent[i]!.r.status === 200)
      .map(({ s, r }) => call('DELETE', `/v2/message/${r.json().id}`, s.authorization))
    const more = senders.map((s) => call('POST', '/v2/message', s.authorization, { recipient: 'bob', body: `r${round} more` }))
    statuses.push(...(await Promise.all([...deletes, ...more])).map((r) => r.status))
  }
  const [after] = await queryRows<{ rollbacks: number }>(built.db, sql`SELECT xact_rollback::int AS rollbacks FROM pg_stat_database WHERE datname = current_database()`)
  t.comment(`${statuses.length} sends and deletes; ${after!.rollbacks - before!.rollbacks} transactions rolled back meanwhile`)
  t.same([...new Set(statuses)].sort(), [200, 204], 'every send 200 and every delete 204: none 500')
  t.ok(after!.rollbacks > before!.rollbacks, 'transactions were aborted and run again')
  // Each answered send wrote its message once (a run again writes nothing twice); each delete removed one.
  const [left] = await queryRows<{ n: number }>(built.db, sql`SELECT count(*)::int AS n FROM messages WHERE recipient = 'bob'`)
  const sends = statuses.filter((s) => s === 200).length
  const deletes = statuses.filter((s) => s === 204).length
  t.equal(left!.n, sends - deletes, `${sends} messages sent, ${deletes} deleted, ${left!.n} left`)
})

t.test('a send cancelled while it waits on a lock (57014, as a lock_timeout firing as its lock is granted reports itself) is tried again: 200, written once', { skip }, async (t) => {
  const built = await build(t, { env: ENV })
  const alice = await built.as('alice')
  await built.createUser('bob')
  const name = new URL(built.url!).pathname.slice(1)
  // bob's row held by another transaction: the send waits on it, and is cancelled as it waits.
  const holder = new pg.Client({ connectionString: built.url })
  await holder.connect()
  t.teardown(() => holder.end())
  const canceller = new pg.Client({ connectionString: built.url })
  await canceller.connect()
  t.teardown(() => canceller.end())
  await holder.query('BEGIN')
  await holder.query("SELECT 1 FROM users WHERE address = 'bob' FOR UPDATE")
  const sent = alice.post('/v2/message', { recipient: 'bob', body: 'cancelled, then sent' })
  let cancelled = 0
  const until = performance.now() + 5_000
  // Twice: a send cancelled more often is answered with the error (send-writer.ts CANCEL_RETRIES).
  while (cancelled < 2 && performance.now() < until) {
    const { rows } = await canceller.query<{ done: boolean }>(`SELECT pg_cancel_backend(pid) AS done FROM pg_stat_activity
      WHERE datname = $1 AND wait_event_type = 'Lock' AND query LIKE '%WITH input AS%'`, [name])
    cancelled += rows.filter((r) => r.done).length
    await new Promise((resolve) => setTimeout(resolve, 5))
  }
  await holder.query('ROLLBACK')
  const res = await sent
  t.ok(cancelled >= 1, `the waiting send's statement was cancelled ${cancelled} times`)
  t.equal(res.statusCode, 200, res.body)
  const [written] = await queryRows<{ n: number }>(built.db, sql`SELECT count(*)::int AS n FROM messages WHERE recipient = 'bob'`)
  t.equal(written!.n, 1, 'written once')
})
