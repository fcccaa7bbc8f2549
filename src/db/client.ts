import { existsSync } from 'node:fs'
import { join } from 'node:path'
import { PGlite } from '@electric-sql/pglite'
import { sql } from 'drizzle-orm'
import { drizzle as drizzlePg } from 'drizzle-orm/node-postgres'
import { migrate as migratePg } from 'drizzle-orm/node-postgres/migrator'
import type { PgDatabase, PgQueryResultHKT } from 'drizzle-orm/pg-core'
import { drizzle as drizzlePglite } from 'drizzle-orm/pglite'
import { migrate as migratePglite } from 'drizzle-orm/pglite/migrator'
import pg from 'pg'
import { lockDataDirectory } from './embedded-lock.js'
import * as schema from './schema.js'

/** The Drizzle database both drivers share; repositories take this (or a transaction). */
export type Db = PgDatabase<PgQueryResultHKT, typeof schema>

export type Driver = 'pg' | 'pglite'

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
  /** Connections: open, idle, and requests waiting for one (pg's pool; PGlite is one connection). */
  stats(): { total: number, idle: number, waiting: number }
  /** Resolves when the database answers a trivial query. */
  ping(): Promise<void>
  close(): Promise<void>
}

export interface LockedSession {
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
}

export async function connectPostgres (url: string, poolSize = 10): Promise<Database> {
  const pool = new pg.Pool({
    connectionString: url,
    max: poolSize,
    // Fail fast when PostgreSQL is away rather than queueing requests forever.
    connectionTimeoutMillis: 5_000,
    idleTimeoutMillis: 30_000
  })
  // A client losing its connection must not crash the process: pg emits 'error' on it, and the
  // pool listens only while the client is idle. With a listener on every client, a connection
  // dropped mid-transaction fails that transaction (503) and the pool replaces the client.
  pool.on('error', () => {})
  pool.on('connect', (client) => { client.on('error', () => {}) })
  const db: Db = drizzlePg({ client: pool, schema })
  // Listening connections are checked out of the pool for good; close() must hand them back.
  const listeners = new Set<() => Promise<void>>()
  return {
    db,
    driver: 'pg',
    created: false,
    async withLock (lockKey, fn) {
      const client = await pool.connect()
      try {
        await client.query('SELECT pg_advisory_lock($1)', [lockKey])
        try {
          const locked = drizzlePg({ client, schema })
          return await fn({ db: locked, migrate: (folder) => migratePg(locked, { migrationsFolder: folder }) })
        } finally {
          await client.query('SELECT pg_advisory_unlock($1)', [lockKey])
        }
      } finally {
        client.release()
      }
    },
    async listen (channel, onNotify, onReconnect) {
      let client: pg.PoolClient | undefined
      let stopped = false
      let retry: NodeJS.Timeout | undefined
      const connect = async (attempt: number): Promise<void> => {
        try {
          const c = await pool.connect()
          c.on('notification', (msg) => { if (msg.channel === channel) onNotify(msg.payload ?? '') })
          c.on('error', () => {
            c.release(true)
            if (client === c) client = undefined
            if (!stopped) retry = setTimeout(() => { void connect(1) }, 200).unref()
          })
          await c.query(`LISTEN ${channel}`)
          if (stopped) {
            c.release(true)
            return
          }
          client = c
          if (attempt > 0) onReconnect?.()
        } catch (err) {
          if (attempt === 0) throw err
          if (!stopped) retry = setTimeout(() => { void connect(attempt + 1) }, Math.min(5_000, 200 * attempt)).unref()
        }
      }
      await connect(0)
      const stop = async () => {
        listeners.delete(stop)
        stopped = true
        clearTimeout(retry)
        const c = client
        client = undefined
        if (c !== undefined) {
          await c.query(`UNLISTEN ${channel}`).catch(() => {})
          c.release(true)
        }
      }
      listeners.add(stop)
      return stop
    },
    stats: () => ({ total: pool.totalCount, idle: pool.idleCount, waiting: pool.waitingCount }),
    async ping () {
      await pool.query('SELECT 1')
    },
    async close () {
      await Promise.all([...listeners].map((stop) => stop()))
      await pool.end()
    }
  }
}

/** Wraps an open PGlite instance (in memory, from a snapshot, or on disk). */
export function wrapPglite (client: PGlite, options: { created?: boolean, onClose?: () => void } = {}): Database {
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
    async close () {
      try {
        await client.close()
      } finally {
        options.onClose?.()
      }
    }
  }
}

export async function openEmbedded (dataDir: string, command = 'serve'): Promise<Database> {
  const release = lockDataDirectory(dataDir, command)
  try {
    const created = !existsSync(join(dataDir, 'PG_VERSION'))
    const client = await PGlite.create(dataDir)
    return wrapPglite(client, { created, onClose: release })
  } catch (err) {
    release()
    throw err
  }
}

/** `DATABASE_URL` set: PostgreSQL through `pg`; unset: embedded PGlite under the data directory. */
export async function openDatabase (options: DatabaseOptions): Promise<Database> {
  if (options.databaseUrl !== undefined) return connectPostgres(options.databaseUrl, options.poolSize)
  return openEmbedded(options.dataDir, options.command)
}
