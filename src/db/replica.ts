import { performance } from 'node:perf_hooks'
import { setTimeout as sleep } from 'node:timers/promises'
import { sql } from 'drizzle-orm'
import { drizzle } from 'drizzle-orm/node-postgres'
import pg from 'pg'
import { AppError } from '../errors.js'
import type { Db } from './client.js'
import { isDatabaseUnavailable, sqlState } from './errors.js'
import { queryRows, setStatementPolicy, type StatementPolicy } from './rows.js'
import * as schema from './schema.js'
import { TimeLimitExceeded, withinTimeLimit } from './time-limit.js'
import { parseLsn, positionSampler } from './wal-position.js'

/*
 * Reads from a streaming replica (DATABASE_READ_URL) that never show a caller less than it
 * has written (API.md §12).
 *
 * Read-your-writes cannot rest on what one process remembers of a caller's writes: behind a
 * load balancer the write and the read land on different instances. It rests on the primary
 * instead. Every write a caller was told succeeded committed before the caller sent its next
 * request, so a WAL position of the primary read after that request arrived lies past all of
 * them (past everything anyone committed before it, in fact). A read goes to the replica only
 * once the replica has replayed that far, checked on the connection that then runs the read,
 * in its transaction: its statements take their snapshots after the check, and replay only
 * moves forward, so they see every one of those commits. Otherwise (the replica still behind
 * after DATABASE_READ_MAX_WAIT_MS, failing, unreachable, or not a standby of this primary) the
 * read runs on the primary, as it would without a replica: a replica in trouble costs
 * latency, never a wrong or a failed answer.
 *
 * Costs, and how they are kept down:
 * - One primary round trip per read for the position, shared: the latest sample, in flight
 *   or answered, serves every request that arrived before it was sent, so a burst of reads
 *   shares one (at most one in flight and one queued behind it; 60 searches at once: 2).
 * - The sample and the replica's first check run at once; the wait is a poll of the replica
 *   every few milliseconds, statement by statement. One statement that slept until replay
 *   caught up would hold its snapshot meanwhile, and replay of a cleanup record that conflicts
 *   with that snapshot waits for the statement (max_standby_streaming_delay): the wait would
 *   hold up what it waits for. Between statements a READ COMMITTED transaction holds none.
 * - A replica found behind or failing is skipped by every read until a background probe finds
 *   it well again (after 250 ms, doubling to 5 s), so only the read that found out pays.
 *
 * The position is pg_current_wal_flush_lsn(): with synchronous_commit on (the default; also
 * local, remote_write, remote_apply) a commit is acknowledged only once its WAL is flushed,
 * and a replica cannot receive WAL before it is flushed, so this is the least position that
 * covers every acknowledged commit. With synchronous_commit = off a commit is acknowledged
 * before its WAL is even written, and only pg_current_wal_insert_lsn() is sure to lie past
 * it: then that is the position, at a cost (WAL inserted but not yet flushed, such as the
 * page pruning reads do, holds reads back until the WAL writer flushes it, up to
 * wal_writer_delay). At a page boundary the insert position points past the page header
 * where replay stops before it; normalizePosition() (wal-position.ts) maps one onto the other.
 */

/** Where a read that may lag ran, and why (the parley_replica_reads_total labels). */
export type ReadOutcome =
  /** The replica had replayed the primary's position: served there. */
  | 'caught_up'
  /** The replica was behind for the whole wait, or known to be behind: the primary. */
  | 'behind'
  /** The replica could not be reached, or lost its connection, or is known down: the primary. */
  | 'unavailable'
  /** The replica answered a query with an error: the primary. */
  | 'error'
  /**
   * Every replica connection of this instance was taken: the primary, for this read only (the
   * replica is not in trouble, only busy; waiting for a connection would be waiting in line).
   */
  | 'busy'
  /**
   * The read met a conflict the replica's replay causes now and then (a query cancelled for a
   * recovery conflict, a lock held by replay past REPLICA_LOCK_WAIT_MS): this read on the
   * primary, the replica kept for the next.
   */
  | 'conflict'
  /** DATABASE_READ_URL reaches a server that is not a standby of DATABASE_URL: the primary. */
  | 'not_standby'
  /** The primary's WAL position could not be read: the primary (which then answers as it can). */
  | 'primary_error'

export type ReplicaState = 'up' | 'behind' | 'down' | 'not_standby'

export interface ReadOptions {
  /**
   * performance.now() when the request arrived (default: now). A WAL position sampled after
   * it covers every write the caller was told of before it sent the request.
   */
  arrivedAt?: number
  /** The read runs with withinTimeLimit(ms) (TimeLimitExceeded past it), wherever it runs. */
  timeLimitMs?: number
}

/**
 * Reads that may be served by a replica. `work` must only read, and must not open a
 * transaction of its own (on the replica it runs inside one; use `timeLimitMs` for a limit).
 */
export interface Reads {
  run<T>(work: (db: Db) => Promise<T>, options?: ReadOptions): Promise<T>
}

interface ReplicaStatus {
  state: ReplicaState
  /** WAL bytes the replica had yet to replay at the last check; undefined when unknown. */
  lagBytes: number | undefined
  /** Seconds since the replica replayed its last transaction while WAL waited to be replayed (0 when all received WAL is replayed); undefined when unknown. */
  lagSeconds: number | undefined
}

export interface ReplicaReads extends Reads {
  status(): ReplicaStatus
  close(): Promise<void>
}

export interface ReplicaOptions {
  /** The primary: positions are read there, and reads fall back to it. */
  primary: Db
  url: string
  poolSize: number
  /** How long a read waits for the replica to replay the primary's position. */
  maxWaitMs: number
  onRead?: (outcome: ReadOutcome) => void
  onStateChange?: (state: ReplicaState, previous: ReplicaState, cause?: unknown) => void
}

/** Without a replica: every read on the primary, as before. */
export function primaryReads (db: Db): Reads {
  return { run: (work, options = {}) => bounded(db, work, options) }
}

function bounded<T> (db: Db, work: (db: Db) => Promise<T>, options: ReadOptions): Promise<T> {
  return options.timeLimitMs === undefined ? work(db) : withinTimeLimit(db, options.timeLimitMs, work)
}

/** A new connection to a replica that is up answers in milliseconds; one that does not is treated as down. */
const CONNECT_TIMEOUT_MS = 1_000
/**
 * A replica query that has not answered in this long is abandoned (its connection destroyed)
 * and the read runs on the primary: what a half-open connection to a vanished replica costs
 * at most. Reads that may run this long have a shorter limit of their own (search: 5 s).
 */
const QUERY_TIMEOUT_MS = 15_000
/**
 * A look at the replica's replay position is one trivial statement: a replica that has not
 * answered it in this long has gone quiet (a half-open connection, a frozen host), and its
 * connection is cut so the read goes to the primary now rather than after QUERY_TIMEOUT_MS.
 */
const LOOK_TIMEOUT_MS = 1_000
/**
 * How long a replica read waits for a lock. Replay takes the locks the primary took (a VACUUM
 * truncating a table, a DDL): a read waiting behind replay that is slow or paused would wait
 * out its whole time limit and answer 503; past this it reads the primary instead.
 */
const REPLICA_LOCK_WAIT_MS = 500
/** SQLSTATEs of a replica read that are replay's doing, not the read's nor a sign of trouble. */
const REPLAY_CONFLICTS = new Set(['40001', '55P03', '57014'])
/** A replica read's whole transaction must end within its time limit plus this, or is cut. */
const READ_GRACE_MS = 1_000
const FIRST_RETRY_MS = 250
const MAX_RETRY_MS = 5_000
/** While the replica is up, a probe refreshes the lag metrics (and notices trouble) this often. */
const PROBE_INTERVAL_MS = 5_000
/** The longest pause between two looks at the replica's replay position while a read waits. */
const MAX_POLL_MS = 4

/**
 * A replica's reads run unnamed statements (queryShaped's and queryPrepared's too): its URL may
 * be a pooler nobody declares (DATABASE_POOLER speaks for DATABASE_URL only), where a named
 * statement is lost between transactions, and a lost one would mark the replica down.
 */
const UNNAMED: StatementPolicy = { named: false, onLost () {} }

/** Connections this module cut because the replica went quiet on them. */
const cut = new WeakSet<pg.PoolClient>()

/**
 * Cuts the client's connection unless the answer (call it) comes within LOOK_TIMEOUT_MS:
 * whatever waits on that connection (the statement, then the transaction's rollback) fails
 * at once, and the read goes to the primary.
 */
function cutUnlessAnswered (client: pg.PoolClient, ms = LOOK_TIMEOUT_MS): () => void {
  const timer = setTimeout(() => {
    cut.add(client)
    client.connection.stream.destroy()
  }, ms)
  return () => clearTimeout(timer)
}

/**
 * Replica transactions read committed and read only, whatever the replica's defaults: under
 * repeatable read the snapshot would be taken by the first look at the replay position, before
 * replay reached the caller's writes, and the read would miss them; serializable cannot run on
 * a hot standby at all.
 */
const READ_COMMITTED = { isolationLevel: 'read committed', accessMode: 'read only' } as const

/** Why a read did not run on the replica although it tried (thrown out of its transaction to roll it back). */
class NotServed extends Error {
  readonly outcome: ReadOutcome
  constructor (outcome: ReadOutcome) {
    super(outcome)
    this.outcome = outcome
  }
}

interface Replay {
  /** False when the server is not in recovery (a primary, or a promoted replica). */
  standby: boolean
  position: bigint
  lagSeconds: number
}

async function replayOf (db: Db): Promise<Replay> {
  const [row] = await queryRows<{ standby: boolean, position: string | null, lag: string | number | null }>(db, sql`
    SELECT pg_is_in_recovery() AS standby, pg_last_wal_replay_lsn()::text AS position,
      CASE WHEN pg_last_wal_receive_lsn() IS NULL OR pg_last_wal_receive_lsn() <= pg_last_wal_replay_lsn() THEN 0
        ELSE EXTRACT(EPOCH FROM now() - pg_last_xact_replay_timestamp()) END AS lag`)
  return {
    standby: row!.standby && row!.position !== null,
    position: row!.position === null ? 0n : parseLsn(row!.position),
    lagSeconds: Math.max(0, Number(row!.lag ?? 0))
  }
}

/** The PostgreSQL cluster's identity: a replica made from a base backup shares its primary's. */
async function systemIdentifier (db: Db): Promise<string | undefined> {
  // Informative only: a server that does not let us read it is taken on trust.
  return queryRows<{ id: string }>(db, sql`SELECT system_identifier::text AS id FROM pg_control_system()`)
    .then(([row]) => row?.id, () => undefined)
}

/**
 * Opens the replica's pool and checks the replica once (a replica that is down leaves every
 * read on the primary until a probe finds it up; starting does not wait for it).
 */
export async function openReplica (options: ReplicaOptions): Promise<ReplicaReads> {
  const { primary, maxWaitMs, poolSize } = options
  const pool = new pg.Pool({
    connectionString: options.url,
    max: poolSize,
    connectionTimeoutMillis: CONNECT_TIMEOUT_MS,
    idleTimeoutMillis: 30_000,
    keepAlive: true,
    query_timeout: QUERY_TIMEOUT_MS
  })
  // As the primary's pool (client.ts): a lost connection fails its query, never the process.
  pool.on('error', () => {})
  pool.on('connect', (client) => { client.on('error', () => {}) })
  const drizzled = new WeakMap<pg.PoolClient, Db>()
  const on = (client: pg.PoolClient): Db => {
    let db = drizzled.get(client)
    if (db === undefined) {
      drizzled.set(client, db = drizzle({ client, schema }))
      setStatementPolicy(client, UNNAMED)
    }
    return db
  }
  const sample = positionSampler(primary)
  const onRead = options.onRead ?? (() => {})

  let state: ReplicaState = 'down'
  let lagBytes: number | undefined
  let lagSeconds: number | undefined
  let closed = false
  let timer: NodeJS.Timeout | undefined
  let retryMs = FIRST_RETRY_MS
  let primaryId: string | undefined

  const become = (next: ReplicaState, cause?: unknown) => {
    const previous = state
    state = next
    if (next !== previous) options.onStateChange?.(next, previous, cause)
  }
  const schedule = (ms: number) => {
    clearTimeout(timer)
    if (!closed) timer = setTimeout(() => { void probe() }, ms).unref()
  }
  /** A read found trouble: every read skips the replica until a probe finds it well. */
  const trouble = (next: Exclude<ReplicaState, 'up'>, cause?: unknown) => {
    if (state !== 'up') return
    become(next, cause)
    if (next === 'down') lagBytes = lagSeconds = undefined
    retryMs = FIRST_RETRY_MS
    schedule(retryMs)
  }

  /**
   * Waits, within maxWaitMs of knowing the primary's position, for the replica to replay it.
   * `position` is the primary's (in flight while the replica's first look runs). `answered`
   * stops the clock started before the transaction's BEGIN, which the first look ends.
   */
  async function caughtUp (client: pg.PoolClient, tx: Db, position: Promise<bigint>, answered: () => void): Promise<{ outcome: ReadOutcome, replay?: Replay }> {
    let replay = await replayOf(tx)
    answered()
    if (!replay.standby) return { outcome: 'not_standby' }
    let target: bigint
    try {
      target = await position
    } catch {
      return { outcome: 'primary_error' }
    }
    lagBytes = Number(target > replay.position ? target - replay.position : 0n)
    const first = replay
    const deadline = performance.now() + maxWaitMs
    for (let pause = 1; replay.position < target; pause = Math.min(pause * 2, MAX_POLL_MS)) {
      const left = deadline - performance.now()
      if (left <= 0) return { outcome: 'behind', replay: first }
      await sleep(Math.min(pause, left))
      const answer = cutUnlessAnswered(client)
      replay = await replayOf(tx).finally(answer)
      if (!replay.standby) return { outcome: 'not_standby' }
    }
    return { outcome: 'caught_up', replay: first }
  }

  /** One look at the replica as a read would take it, outside any read: sets the state. */
  async function probe (): Promise<void> {
    if (closed) return
    let next: ReplicaState = 'down'
    let cause: unknown
    try {
      primaryId ??= await systemIdentifier(primary)
      const position = sample(performance.now())
      position.catch(() => {})
      const client = await pool.connect()
      let broken = false
      try {
        const answer = cutUnlessAnswered(client)
        const replicaId = await systemIdentifier(on(client)).finally(answer)
        if (primaryId !== undefined && replicaId !== undefined && primaryId !== replicaId) {
          next = 'not_standby'
          cause = new Error('the replica is not a copy of the primary (their system identifiers differ)')
        } else {
          const answered = cutUnlessAnswered(client)
          // Bare, not transaction.ts's: a probe that fails says the replica is down, and the
          // next probe is the retry (on a schedule that backs off).
          // eslint-disable-next-line no-restricted-syntax -- a probe is not run again (above).
          const { outcome, replay } = await on(client).transaction((tx) => caughtUp(client, tx, position, answered), READ_COMMITTED).finally(answered)
          if (replay !== undefined) lagSeconds = replay.lagSeconds
          next = outcome === 'caught_up' ? 'up' : outcome === 'behind' ? 'behind' : outcome === 'not_standby' ? 'not_standby' : 'down'
          if (next === 'not_standby') cause = new Error('the replica is not in recovery (a primary, or a promoted replica)')
        }
      } catch (err) {
        broken = true
        throw err
      } finally {
        client.release(broken)
      }
    } catch (err) {
      cause = err
    }
    if (closed) return
    if (next === 'down') lagBytes = lagSeconds = undefined
    become(next, cause)
    if (next === 'up') {
      retryMs = FIRST_RETRY_MS
      schedule(PROBE_INTERVAL_MS)
    } else {
      schedule(retryMs)
      retryMs = Math.min(retryMs * 2, MAX_RETRY_MS)
    }
  }

  const skipped: Record<Exclude<ReplicaState, 'up'>, ReadOutcome> = { behind: 'behind', down: 'unavailable', not_standby: 'not_standby' }

  async function run<T> (work: (db: Db) => Promise<T>, options: ReadOptions = {}): Promise<T> {
    const onPrimary = (outcome: ReadOutcome) => {
      onRead(outcome)
      return bounded(primary, work, options)
    }
    if (closed || state !== 'up') return onPrimary(closed ? 'unavailable' : skipped[state as Exclude<ReplicaState, 'up'>])
    // Every connection taken: a read that waited for one would be counted as a replica gone
    // quiet (the connect timeout bounds the pool's queue too), and would wait in line anyway.
    if (pool.totalCount >= poolSize && pool.idleCount === 0) return onPrimary('busy')
    // Sent now, while the replica's connection and first look are under way.
    const position = sample(options.arrivedAt ?? performance.now())
    position.catch(() => {})
    let client: pg.PoolClient
    try {
      client = await pool.connect()
    } catch (err) {
      trouble('down', err)
      return onPrimary('unavailable')
    }
    let working = false
    let broken = false
    const answered = cutUnlessAnswered(client)
    // The whole transaction, its rollback included, is bounded too: a replica gone quiet in
    // the middle of a read costs that read its time limit and a second, then the primary.
    const ended = cutUnlessAnswered(client, Math.min(QUERY_TIMEOUT_MS, (options.timeLimitMs ?? QUERY_TIMEOUT_MS) + READ_GRACE_MS))
    try {
      // Bare, not transaction.ts's: a read the replica fails runs on the primary (below), which
      // is its retry; running it on the replica again would hold the read past the time bounds
      // above, behind a replica in trouble.
      // eslint-disable-next-line no-restricted-syntax -- the fallback is the retry (above).
      const result = await on(client).transaction(async (tx) => {
        const { outcome } = await caughtUp(client, tx, position, answered)
        if (outcome !== 'caught_up') throw new NotServed(outcome)
        await tx.execute(sql.raw(`SET LOCAL lock_timeout = '${REPLICA_LOCK_WAIT_MS}ms'`))
        working = true
        return bounded(tx, work, options)
      }, READ_COMMITTED)
      onRead('caught_up')
      return result
    } catch (err) {
      if (err instanceof NotServed) {
        if (err.outcome === 'behind' || err.outcome === 'not_standby') trouble(err.outcome)
        return onPrimary(err.outcome)
      }
      // The read's own answer (403, 404, 400, a search past its time limit) stands.
      if (working && (err instanceof AppError || err instanceof TimeLimitExceeded)) throw err
      // Replay's doing, now and then: this read on the primary, the replica kept. Only reads
      // run here, so running one again there repeats nothing.
      const state = sqlState(err)
      if (working && !cut.has(client) && state !== undefined && REPLAY_CONFLICTS.has(state)) return onPrimary('conflict')
      broken = true
      const unavailable = cut.has(client) || isDatabaseUnavailable(err) || /Query read timeout/.test((err as Error).message)
      trouble('down', err)
      return onPrimary(unavailable ? 'unavailable' : 'error')
    } finally {
      answered()
      ended()
      client.release(broken)
    }
  }

  await probe()
  return {
    run,
    status: () => ({ state, lagBytes, lagSeconds }),
    async close () {
      closed = true
      clearTimeout(timer)
      await pool.end()
    }
  }
}
