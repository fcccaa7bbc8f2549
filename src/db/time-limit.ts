import { sql } from 'drizzle-orm'
import type { Db } from './client.js'
import { sqlState } from './errors.js'

const QUERY_CANCELED = '57014'

/** Thrown by withinTimeLimit when a statement ran past its limit (PostgreSQL cancelled it). */
export class TimeLimitExceeded extends Error { override name = 'TimeLimitExceeded' }

/**
 * Runs `work` in a read-only transaction whose statements PostgreSQL cancels after `ms`: the
 * last resort that bounds what one request can cost the database, whatever its input.
 */
export async function withinTimeLimit<T> (db: Db, ms: number, work: (tx: Db) => Promise<T>): Promise<T> {
  try {
    return await db.transaction(async (tx) => {
      // SET takes no parameters; ms is an integer from our own code.
      await tx.execute(sql`SET TRANSACTION READ ONLY`)
      await tx.execute(sql.raw(`SET LOCAL statement_timeout = ${Math.trunc(ms)}`))
      return work(tx)
    })
  } catch (err) {
    if (sqlState(err) === QUERY_CANCELED) throw new TimeLimitExceeded(`a statement ran past ${ms} ms`, { cause: err })
    throw err
  }
}
