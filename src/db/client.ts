import { randomBytes } from 'node:crypto'
import { existsSync } from 'node:fs'
import { join } from 'node:path'
import { PGlite, types } from '@electric-sql/pglite'
import { sql } from 'drizzle-orm'
import { drizzle as drizzlePg } from 'drizzle-orm/node-postgres'
import { migrate as migratePg } from 'drizzle-orm/node-postgres/migrator'
import type { PgDatabase, PgQueryResultHKT } from 'drizzle-orm/pg-core'
import { drizzle as drizzlePglite } from 'drizzle-orm/pglite'
import { migrate as migratePglite } from 'drizzle-orm/pglite/migrator'
import pg from 'pg'
import { lockDataDirectory } from './embedded-lock.js'
import { setStatementPolicy, type StatementPolicy } from './rows.js'
import * as schema from './schema.js'

/** The Drizzle database both drivers share; repositories take this (or a transaction). */
export type Db = PgDatabase<PgQueryResultHKT, typeof schema>

type Driver = 'pg' | 'pglite'

export interface Database {
  db: Db
  driver: Driver
  /** True when the embedded database was created by this open (its first start). */
  created: boolean
  /**
   * Runs `fn` on one connection that holds `lockKey` as a session advisory lock; `fn` may apply
   * the migrations in a folder on that connection.
   */
  withLock<T>(lockKey: number, fn: (session: LockedSession) => Promise<T>): Promise<T>
  /**
   * Calls `onNotify` with the payload of every NOTIFY on `channel` (lower-case), over one
   * connection for the whole process. `onReconnect` runs after a lost connection is back, since
   * notifications sent meanwhile are gone. Resolves with a function that stops listening.
   */
  listen(channel: string, onNotify: (payload: string) => void, onReconnect?: () => void): Promise<() => Promise<void>>
  /**
   * PostgreSQL only: this Database's own listening sessions, so that a process alone on its
   * database can hand its notifications to its own listeners instead of to PostgreSQL.
   */
  readonly listening?: OwnListening
  /** Connections: open, idle, and requests waiting for one (pg's pool; PGlite is one connection). */
  stats(): { total: number, idle: number, waiting: number }
  /** Resolves when the database answers a trivial query. */
  ping(): Promise<void>
  /**
   * Whether the hottest statements run as named prepared statements: not through a
   * transaction pooler, nor once one was found lost (then `onStatementsLost` listeners hear it).
   */
  readonly namedStatements: boolean
  onStatementsLost(listener: (err: unknown) => void): void
  close(): Promise<void>
}

/**
 * The `application_name` of a pool's connections, which never LISTEN: a look for other
 * listeners leaves them out (announcements.repository.ts). A name unlikely to be chosen for
 * anything else, since a session that listened under it would go unseen. An `application_name`
 * in the URL takes its place (pg prefers the URL's), and the pool is then counted as sessions
 * that may listen.
 */
export const POOL_APPLICATION_NAME = 'parley pool (never listens)'

/** A Database's own listening sessions (PostgreSQL). */
export interface OwnListening {
  /**
   * The `application_name` its listening sessions set once connected (set_config, so a name
   * in the URL does not hide them), the same for all of them and for no other Database's: a
   * session of that name is this Database's own, whatever its pid (a pid a restarted server
   * handed to someone else's session is not mistaken for one).
   */
  readonly name: string
  /** Hands `payload` to this Database's listeners on `channel`, as a NOTIFY of it would. */
  deliver(channel: string, payload: string): void
  /**
   * Calls `fn` whenever a listening session joins the database, this Database's or another
   * process's: each says so with an empty NOTIFY on its channel once it listens, which
   * `listen`'s callers never hear. Returns the way to stop.
   */
  onJoined(fn: () => void): () => void
}

interface LockedSession {
  db: Db
  migrate(folder: string): Promise<void>
}

export interface DatabaseOptions {
  databaseUrl?: string | undefined
  dataDir: string
  /** Which `parley` command holds an embedded database, for the lock-file message. */
  command?: string
  /** Postgres pool size. */
  poolSize?: number
  /** See PostgresOptions. */
  listenHeartbeatMs?: number
  directUrl?: string | undefined
  pooler?: Pooler
}

/** What stands between `DATABASE_URL` and PostgreSQL: a transaction pooler (PgBouncer), or nothing. */
type Pooler = 'transaction' | 'none'

export interface PostgresOptions {
  /**
   * A session connection to the same database (`DATABASE_DIRECT_URL`), for what a transaction
   * pooler cannot carry: LISTEN and the session advisory lock of migrations. Default: `url`.
   */
  directUrl?: string | undefined
  /**
   * 'transaction': `url` is a transaction pooler, so every statement is unnamed (a named one
   * lives on one server connection, and the pooler gives the next transaction another).
   * Default 'none'; a pooler left undeclared is noticed at the first lost statement.
   */
  pooler?: Pooler
  /**
   * How often the LISTEN connection proves it is alive with a `SELECT 1`, which must answer
   * within the same time. A half-open connection (a peer or a middlebox gone without a word)
   * raises no error and delivers no notifications; this notices it, and reconnects.
   */
  listenHeartbeatMs?: number
}

const DEFAULT_LISTEN_HEARTBEAT_MS = 15_000

/** Ends a client politely, or cuts its socket if the goodbye takes longer than `ms`. */
async function endWithin (c: pg.Client, ms: number): Promise<void> {
  let timer: NodeJS.Timeout | undefined
  const cut = new Promise<void>((resolve) => {
    timer = setTimeout(() => {
      c.connection.stream.destroy()
      resolve()
    }, ms)
  })
  await Promise.race([c.end().catch(() => {}), cut])
  clearTimeout(timer)
}

export async function connectPostgres (url: string, poolSize = 10, options: PostgresOptions = {}): Promise<Database> {
  const heartbeatMs = options.listenHeartbeatMs ?? DEFAULT_LISTEN_HEARTBEAT_MS
  const directUrl = options.directUrl ?? url
  const lostListeners = new Set<(err: unknown) => void>()
  const statements: StatementPolicy = {
    named: options.pooler !== 'transaction',
    onLost: (err) => { for (const listener of lostListeners) listener(err) }
  }
  const pool = new pg.Pool({
    connectionString: url,
    application_name: POOL_APPLICATION_NAME,
    max: poolSize,
    // Fail fast when PostgreSQL is away rather than queueing requests forever.
    connectionTimeoutMillis: 5_000,
    idleTimeoutMillis: 30_000,
    // The kernel's own probes find a dead peer eventually, even on a connection left idle.
    keepAlive: true
  })
  // A client losing its connection must not crash the process: pg emits 'error' on it, and the
  // pool listens only while the client is idle. With a listener on every client, a connection
  // dropped mid-transaction fails that transaction (503) and the pool replaces the client.
  pool.on('error', () => {})
  pool.on('connect', (client) => {
    client.on('error', () => {})
    setStatementPolicy(client, statements)
  })
  setStatementPolicy(pool, statements)
  const db: Db = drizzlePg({ client: pool, schema })
  // Listening connections are the pool's peers, not its members; close() must end them.
  const listeners = new Set<() => Promise<void>>()
  // Who listens, by channel; the name this Database's listening sessions go by; who hears that a listener joined.
  const hearers = new Map<string, Set<(payload: string) => void>>()
  const listenerName = `parley listener ${randomBytes(6).toString('hex')}`
  const joinedHearers = new Set<() => void>()
  return {
    db,
    driver: 'pg',
    created: false,
    async withLock (lockKey, fn) {
      // A session lock is held by a server connection: through a transaction pooler, the lock
      // and its unlock would each go to whichever connection is free, and a lock left on one
      // would stop every later migration. A direct URL of its own gets a connection of its own.
      const own = directUrl === url ? undefined : new pg.Client({ connectionString: directUrl, connectionTimeoutMillis: 5_000, keepAlive: true })
      own?.on('error', () => {})
      await own?.connect()
      const client = own ?? await pool.connect()
      try {
        await client.query('SELECT pg_advisory_lock($1)', [lockKey])
        let result: Awaited<ReturnType<typeof fn>>
        try {
          const locked = drizzlePg({ client, schema })
          result = await fn({ db: locked, migrate: (folder) => migratePg(locked, { migrationsFolder: folder }) })
        } catch (err) {
          await client.query('SELECT pg_advisory_unlock($1)', [lockKey]).catch(() => {})
          throw err
        }
        const { rows } = await client.query<{ unlocked: boolean }>('SELECT pg_advisory_unlock($1) AS unlocked', [lockKey])
        // Not this connection's lock: the lock and the unlock went to different server
        // connections, through a transaction pooler nobody declared; the lock is left held there.
        if (rows[0]?.unlocked !== true) {
          throw new Error('The migrations\' lock was taken through a transaction pooler and is left held on one of its server connections ' +
            '(later migrations wait for it until that connection closes): set DATABASE_DIRECT_URL to a connection that bypasses the pooler')
        }
        return result
      } finally {
        if (own === undefined) (client as pg.PoolClient).release()
        else await endWithin(own, 5_000)
      }
    },
    async listen (channel, onNotify, onReconnect) {
      let client: pg.Client | undefined
      let stopped = false
      let retry: NodeJS.Timeout | undefined
      let beating = false
      // Drops a connection for good (its socket too: ending a half-open one would wait on a
      // goodbye that never leaves) and, unless stopping, connects anew.
      const drop = (c: pg.Client): void => {
        if (client !== c) return
        client = undefined
        c.connection.stream.destroy()
        c.end().catch(() => {})
        if (!stopped) retry = setTimeout(() => { void connect(1) }, 200).unref()
      }
      const connect = async (attempt: number): Promise<void> => {
        // Its own connection, outside the pool: held for good, with its own keepalive.
        // LISTEN is session state: through a transaction pooler it would be registered on a
        // server connection that is then lent to others, and notifications would go nowhere.
        const c = new pg.Client({ connectionString: directUrl, connectionTimeoutMillis: 5_000, keepAlive: true })
        c.on('error', () => drop(c))
        c.on('notification', (msg) => {
          if (msg.channel !== channel) return
          const payload = msg.payload ?? ''
          // A listener joined (see OwnListening.onJoined): nothing for the callers.
          if (payload === '') for (const joined of joinedHearers) joined()
          else onNotify(payload)
        })
        try {
          await c.connect()
          await c.query("SELECT set_config('application_name', $1, false)", [listenerName])
          await c.query(`LISTEN ${channel}`)
          // An instance alone on the database that hears this NOTIFYs from then on; one that
          // does not (its listener is down) finds this session at its next look.
          await c.query(`NOTIFY ${channel}`)
        } catch (err) {
          c.connection.stream.destroy()
          c.end().catch(() => {})
          if (attempt === 0) throw err
          if (!stopped) retry = setTimeout(() => { void connect(attempt + 1) }, Math.min(5_000, 200 * attempt)).unref()
          return
        }
        if (stopped) {
          await endWithin(c, heartbeatMs)
          return
        }
        client = c
        // Notifications sent while no connection listened are gone: let waiters look again.
        if (attempt > 0) onReconnect?.()
      }
      // The first connection's failure is the caller's, before any heartbeat runs; once it is up,
      // the heartbeat finds a connection gone quiet.
      await connect(0)
      const heartbeat = setInterval(() => {
        const c = client
        if (c === undefined || beating) return
        beating = true
        let timer: NodeJS.Timeout | undefined
        const late = new Promise<never>((_resolve, reject) => {
          timer = setTimeout(() => reject(new Error('LISTEN connection heartbeat timed out')), heartbeatMs)
        })
        Promise.race([c.query('SELECT 1'), late])
          .catch(() => drop(c))
          .finally(() => {
            clearTimeout(timer)
            beating = false
          })
      }, heartbeatMs).unref()
      const channelHearers = hearers.get(channel) ?? new Set()
      hearers.set(channel, channelHearers.add(onNotify))
      const stop = async () => {
        listeners.delete(stop)
        channelHearers.delete(onNotify)
        stopped = true
        clearTimeout(retry)
        clearInterval(heartbeat)
        const c = client
        client = undefined
        // Ending the connection ends its LISTEN; a connection gone quiet is cut after a while.
        if (c !== undefined) await endWithin(c, heartbeatMs)
      }
      listeners.add(stop)
      return stop
    },
    listening: {
      name: listenerName,
      deliver (channel, payload) {
        // Every listener hears it, whatever one of them throws; the first error is the caller's.
        let failure: { err: unknown } | undefined
        for (const hear of [...hearers.get(channel) ?? []]) {
          try { hear(payload) } catch (err) { failure ??= { err } }
        }
        if (failure !== undefined) throw failure.err
      },
      onJoined (fn) {
        joinedHearers.add(fn)
        return () => { joinedHearers.delete(fn) }
      }
    },
    stats: () => ({ total: pool.totalCount, idle: pool.idleCount, waiting: pool.waitingCount }),
    async ping () {
      await pool.query('SELECT 1')
    },
    get namedStatements () { return statements.named },
    onStatementsLost (listener) { lostListeners.add(listener) },
    async close () {
      await Promise.all([...listeners].map((stop) => stop()))
      await pool.end()
    }
  }
}

/**
 * PGlite converts bytea to and from its hex text one byte at a time in JavaScript
 * (`Array.from(bytes).map(b => b.toString(16))` one way, a parseInt per pair the other): a
 * 256 KiB attachment chunk held the event loop, which answers every other request, for ~30 ms
 * each way. Node's hex codec does the same conversion natively in well under a millisecond.
 */
function convertByteaNatively (client: PGlite): void {
  client.serializers[types.BYTEA] = (value: unknown) => {
    if (!(value instanceof Uint8Array)) throw new TypeError('bytea parameter: expected a Uint8Array')
    return `\\x${Buffer.from(value.buffer, value.byteOffset, value.byteLength).toString('hex')}`
  }
  client.parsers[types.BYTEA] = (text: string) => Buffer.from(text.slice(2), 'hex')
}

/** Wraps an open PGlite instance (in memory, from a snapshot, or on disk). */
export function wrapPglite (client: PGlite, options: { created?: boolean, onClose?: () => void } = {}): Database {
  convertByteaNatively(client)
  const db: Db = drizzlePglite({ client, schema })
  return {
    db,
    driver: 'pglite',
    created: options.created ?? false,
    async withLock (_lockKey, fn) {
      // One connection in one process (the data directory lock): nothing else can interleave.
      return fn({ db, migrate: (folder) => migratePglite(drizzlePglite({ client, schema }), { migrationsFolder: folder }) })
    },
    async listen (channel, onNotify) {
      const unlisten = await client.listen(channel, onNotify)
      // Unlistening on a closed PGlite never settles; there is nothing left to stop then.
      return async () => { if (!client.closed) await unlisten() }
    },
    stats: () => ({ total: client.closed ? 0 : 1, idle: 0, waiting: 0 }),
    async ping () {
      await db.execute(sql`SELECT 1`)
    },
    namedStatements: true,
    onStatementsLost () {},
    async close () {
      try {
        await client.close()
      } finally {
        options.onClose?.()
      }
    }
  }
}

/**
 * The embedded database's start for a short-lived command (migrate, user, key): 16 MB of shared
 * buffers instead of PGlite's 128, whose zeroing was about half of every start (0.7-1.4 s of
 * CPU); a command runs a few statements. The server keeps PostgreSQL's default.
 */
const COMMAND_START_PARAMS = [...PGlite.defaultStartParams, '-c', 'shared_buffers=16MB']

async function openEmbedded (dataDir: string, command = 'serve'): Promise<Database> {
  const release = await lockDataDirectory(dataDir, command)
  try {
    const created = !existsSync(join(dataDir, 'PG_VERSION'))
    const client = await PGlite.create(dataDir, command === 'serve' ? {} : { startParams: COMMAND_START_PARAMS })
    return wrapPglite(client, { created, onClose: release })
  } catch (err) {
    release()
    throw err
  }
}

/** `DATABASE_URL` set: PostgreSQL through `pg`; unset: embedded PGlite under the data directory. */
export async function openDatabase (options: DatabaseOptions): Promise<Database> {
  if (options.databaseUrl !== undefined) {
    return connectPostgres(options.databaseUrl, options.poolSize, {
      listenHeartbeatMs: options.listenHeartbeatMs, directUrl: options.directUrl, pooler: options.pooler
    })
  }
  return openEmbedded(options.dataDir, options.command)
}
