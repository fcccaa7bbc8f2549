import { sql } from 'drizzle-orm'
import type { Db } from './client.js'
import { sqlState } from './errors.js'
import { transaction } from './transaction.js'

const QUERY_CANCELED = '57014'

/** Thrown by withinTimeLimit when a statement ran past its limit (PostgreSQL cancelled it). */
export class TimeLimitExceeded extends Error { override name = 'TimeLimitExceeded' }

/**
 * Runs `work` in a read-only transaction whose statements PostgreSQL cancels after `ms`: the
 * last resort that bounds what one request can cost the database, whatever its input. Retried
 * as any transaction is (transaction.ts: a lost named statement, an operator's isolation level),
 * but a statement cancelled at its limit is not run again; on the replica, inside the read's
 * own transaction, it is a savepoint run once (replica.ts falls back to the primary instead).
 */
export async function withinTimeLimit<T> (db: Db, ms: number, work: (tx: Db) => Promise<T>): Promise<T> {
  try {
    return await transaction(db, async (tx) => {
      // SET takes no parameters; ms is an integer from our own code.
      await tx.execute(sql`SET TRANSACTION READ ONLY`)
      await tx.execute(sql.raw(`SET LOCAL statement_timeout = ${Math.trunc(ms)}`))
      // No JIT for these reads: a search over many rows is costed past jit_above_cost, and
      // compiling it took 105 of its 285 ms (BENCHMARKS.md, search on 300,000 messages).
      await tx.execute(sql`SET LOCAL jit = off`)
      return work(tx)
    })
  } catch (err) {
    if (sqlState(err) === QUERY_CANCELED) throw new TimeLimitExceeded(`a statement ran past ${ms} ms`, { cause: err })
    throw err
  }
}
