import { sql } from 'drizzle-orm'
import type { Db } from './client.js'
import { queryRows } from './rows.js'
import { instanceSettings } from './settings.table.js'

/** Facts about this installation, each claimed by one instance (instance_settings). */
export function createSettingsRepository (db: Db) {
  return {
    /** Records `key` the first time only: true for the one caller that recorded it. */
    async claimOnce (key: string): Promise<boolean> {
      const claimed = await db.insert(instanceSettings)
        .values({ key, value: sql`'true'::jsonb` })
        .onConflictDoNothing()
        .returning({ key: instanceSettings.key })
      return claimed.length > 0
    },

    /**
     * Records `key` now if it was last recorded at least `minIntervalMs` ago (or never): true
     * for the one caller per period that did, so periodic work runs once however many
     * instances try.
     */
    async claimEvery (key: string, minIntervalMs: number): Promise<boolean> {
      const claimed = await queryRows<{ key: string }>(db, sql`
        INSERT INTO instance_settings (key, value, updated_at) VALUES (${key}, 'true'::jsonb, now())
        ON CONFLICT (key) DO UPDATE SET updated_at = now()
        WHERE instance_settings.updated_at <= now() - make_interval(secs => ${minIntervalMs / 1000})
        RETURNING key`)
      return claimed.length > 0
    },

    /** Whether `key` was ever recorded. */
    async has (key: string): Promise<boolean> {
      const [row] = await queryRows<{ key: string }>(db, sql`SELECT key FROM instance_settings WHERE key = ${key}`)
      return row !== undefined
    },

    /** Takes a transaction-scoped advisory lock if no one holds it: whether it was taken. */
    async tryLock (lockKey: number): Promise<boolean> {
      const [lock] = await queryRows<{ locked: boolean }>(db, sql`SELECT pg_try_advisory_xact_lock(${lockKey}) AS locked`)
      return lock?.locked === true
    },

    /**
     * Takes a transaction-scoped advisory lock, waiting at most `waitMs` for whoever holds it
     * (PostgreSQL queues waiters fairly: a holder's next try does not jump the queue). Past the
     * wait it throws 55P03 (lock_not_available) and the transaction is aborted; once taken, the
     * transaction's lock waits are bounded by the database's own lock_timeout again. Under
     * repeatable read the snapshot is taken before the wait: callers read committed.
     */
    async lock (lockKey: number, waitMs: number): Promise<void> {
      await db.execute(sql.raw(`SET LOCAL lock_timeout = '${Math.max(1, Math.round(waitMs))}ms'`))
      await db.execute(sql`SELECT pg_advisory_xact_lock(${lockKey})`)
      await db.execute(sql`SET LOCAL lock_timeout TO DEFAULT`)
    }
  }
}
