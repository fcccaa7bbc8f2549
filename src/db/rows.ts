import type { SQL } from 'drizzle-orm'
import type { Db } from './client.js'

/**
 * Runs raw SQL and returns its rows. Both drivers answer `{ rows }`, but the shared Drizzle
 * base type leaves the result untyped, so the one cast lives here.
 */
export async function queryRows<T> (db: Db, query: SQL): Promise<T[]> {
  const result = await db.execute(query) as unknown as { rows: T[] }
  return result.rows
}
