import { PgTransaction, type PgTransactionConfig } from 'drizzle-orm/pg-core'
import type { Db } from './client.js'
import { sqlState } from './errors.js'
import { isStatementLost } from './rows.js'

/** SQLSTATEs that mean "run the transaction again": serialization failure and deadlock. */
const RETRYABLE = new Set(['40001', '40P01'])
/**
 * Up to ten runs, the waits doubling from 10 ms to at most 250 ms (about 1.5 s in all): five
 * runs 10 ms apart were not enough for a delete under REPEATABLE READ beside a steady stream of
 * sends to the same user (each commit to its feed row failed the delete's next run again).
 */
const ATTEMPTS = 10
const BASE_DELAY_MS = 10
const MAX_DELAY_MS = 250

function isRetryable (err: unknown): boolean {
  const state = sqlState(err)
  // A named statement lost through an undeclared pooler aborted the transaction before it did
  // anything; its database runs unnamed statements from then on (rows.ts), so a run again works.
  return state !== undefined && (RETRYABLE.has(state) || isStatementLost(err))
}

/**
 * Runs `work` again when the database aborted it as a deadlock victim or a serialization
 * failure (or a named statement was lost, see rows.ts): those are the database's way of asking
 * for a retry, never the client's fault, so they must not become 500s. Bounded attempts with
 * jittered exponential backoff, so two victims do not collide again in step.
 */
async function withRetry<T> (work: () => Promise<T>): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await work()
    } catch (err) {
      if (attempt >= ATTEMPTS || !isRetryable(err)) throw err
      const delay = Math.min(MAX_DELAY_MS, BASE_DELAY_MS * 2 ** (attempt - 1)) * (0.5 + Math.random())
      await new Promise((resolve) => setTimeout(resolve, delay))
    }
  }
}

/** Whether `db` is a transaction already (drizzle's `tx`), not the database. */
function isTransaction (db: Db): boolean {
  return db instanceof PgTransaction
}

/** What runs once a transaction has committed, given the database it was begun on. */
type AfterCommit = (root: Db) => void
/** The after-commit work of each transaction this module began, by its `tx` (and savepoints'). */
const committing = new WeakMap<Db, { root: Db, hooks: AfterCommit[] }>()

/**
 * Runs `hook` once what was written through `db` has committed: at once when `db` is the
 * database itself (its statement committed on its own), else when the outermost transaction
 * `db` belongs to commits, and never if it rolls back (a savepoint rolled back drops the hooks
 * registered within it). For work the database must not do inside a writer's commit, such as
 * NOTIFY (events/announcements.repository.ts). `hook` must not throw. A transaction begun elsewhere than
 * here has no way to run it: that is a mistake in this program, and throws.
 */
export function afterCommit (db: Db, hook: AfterCommit): void {
  if (!isTransaction(db)) return hook(db)
  const pending = committing.get(db)
  if (pending === undefined) throw new Error('afterCommit: a transaction not begun by db/transaction.ts')
  pending.hooks.push(hook)
}

/**
 * One run of `work` in a transaction (or a savepoint of `db`'s), its after-commit hooks run
 * once it commits (or, for a savepoint, handed to its transaction once released).
 */
async function runOnce<T> (db: Db, work: (tx: Db) => Promise<T>, config?: PgTransactionConfig): Promise<T> {
  const nested = isTransaction(db)
  const outer = committing.get(db)
  // A savepoint of a transaction begun elsewhere registers nothing: afterCommit throws there.
  const mine = nested && outer === undefined ? undefined : { root: outer?.root ?? db, hooks: [] as AfterCommit[] }
  const result = await db.transaction((tx) => {
    if (mine !== undefined) committing.set(tx, mine)
    return work(tx)
  }, nested ? undefined : config)
  if (mine === undefined) return result
  if (outer !== undefined) outer.hooks.push(...mine.hooks)
  else for (const hook of mine.hooks) hook(mine.root)
  return result
}

/**
 * The one way to run a transaction: `db.transaction(work)`, retried whole on deadlock or
 * serialization failure (or a lost named statement). `work` may therefore run more than once:
 * it must do nothing outside the database that a rollback would not undo (afterCommit defers
 * what must happen only once it commits). `npm run lint` refuses a bare `db.transaction`
 * elsewhere in src/ (eslint.config.js names the exceptions).
 *
 * Inside another transaction (`db` is one) it is a savepoint, run once: the failure belongs to
 * the transaction around it, which must run again whole (a serialization failure recurs for as
 * long as its snapshot does), by its own retry where it has one; a read on the replica
 * (replica.ts) falls back to the primary instead. `config` (isolation level, access mode)
 * applies to a transaction of its own only: a savepoint has its transaction's.
 */
export async function transaction<T> (db: Db, work: (tx: Db) => Promise<T>, config?: PgTransactionConfig): Promise<T> {
  if (isTransaction(db)) return runOnce(db, work)
  return withRetry(() => runOnce(db, work, config))
}

/**
 * One try at a transaction, not run again on a deadlock or serialization failure: for a caller
 * that handles those itself (the send writer splits a failed batch and tries each send alone).
 */
export async function transactionOnce<T> (db: Db, work: (tx: Db) => Promise<T>): Promise<T> {
  return runOnce(db, work)
}
