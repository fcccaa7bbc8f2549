import { sql } from 'drizzle-orm'
import type { Database, Db } from './client.js'

/**
 * Runs `work` against one consistent view of the database, for reads that take as long as a
 * client takes to download them (an export). On PostgreSQL: a REPEATABLE READ, READ ONLY
 * transaction on a connection of its own, so every statement of `work` sees the database as it
 * was at the first, whatever commits meanwhile. Run once: `work` streams what it reads to a
 * client, and a second run would send it twice (a read-only transaction is never asked to run
 * again for serialization). Embedded PGlite has one connection for every request, and a
 * transaction held open for a download would stop them all: there `work` reads the database
 * itself, statement by statement, and the caller bounds what it reads by time (`consistent`
 * says which it got).
 */
export async function readSnapshot<T> (database: Pick<Database, 'db' | 'driver'>, work: (reader: Db, consistent: boolean) => Promise<T>): Promise<T> {
  if (database.driver === 'pglite') return work(database.db, false)
  // eslint-disable-next-line no-restricted-syntax -- run once (above): a retry would stream twice.
  return database.db.transaction(async (tx) => {
    await tx.execute(sql`SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY`)
    return work(tx, true)
  })
}
