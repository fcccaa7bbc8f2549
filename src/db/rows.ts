import { createHash } from 'node:crypto'
import type { Query, SQL } from 'drizzle-orm'
import { PgDialect, PgTransaction } from 'drizzle-orm/pg-core'
import type { Db } from './client.js'
import { sqlState } from './errors.js'

/**
 * Runs raw SQL and returns its rows. Both drivers answer `{ rows }`, but the shared Drizzle
 * base type leaves the result untyped, so the one cast lives here.
 */
export async function queryRows<T> (db: Db, query: SQL): Promise<T[]> {
  const result = await db.execute(query) as unknown as { rows: T[] }
  return result.rows
}

/** A time as a raw statement answers it: text (Drizzle's sessions leave it unparsed), or a Date. */
export type DriverTime = string | Date

export const dateOf = (value: DriverTime): Date => value instanceof Date ? value : new Date(value)

export const dateOrNull = (value: DriverTime | null): Date | null => value === null ? null : dateOf(value)

const dialect = new PgDialect()
/**
 * Statement names by SQL text: a handful of shapes, each named once for the process. A name is
 * a hash of its text, so it means the same statement in every process: through a pooler nobody
 * declared, a connection prepared by another instance then has either this statement or none
 * of that name, never another statement under it (numbered in the order each process met them,
 * `parley_3` was one statement here and another there, run with the wrong parameters).
 */
const statementNames = new Map<string, string>()

export function statementName (text: string): string {
  let name = statementNames.get(text)
  if (name === undefined) {
    name = `parley_${createHash('sha256').update(text).digest('hex').slice(0, 24)}`
    statementNames.set(text, name)
  }
  return name
}

/**
 * queryRows() as a named prepared statement, for the hottest statements: PostgreSQL parses and
 * plans it once per connection instead of on every call (for a send, about half of the
 * database's work). Each distinct SQL text gets its own name, so one name never means two
 * texts; values travel as parameters, so the texts are a handful of shapes.
 */
export async function queryPrepared<T> (db: Db, query: SQL): Promise<T[]> {
  return execute<T>(db, dialect.sqlToQuery(query), {})
}

/** Statements built with placeholders, by shape (see queryShaped). */
const shapes = new Map<string, Query>()

/**
 * queryPrepared() for the hottest statement of all, whose text depends only on `shape`: `build`
 * writes it with `sql.placeholder(name)` for every value and runs once per shape; later calls
 * only fill in `values`. Building the text anew (a send batch's is 6.7 kB) cost ~70 µs of the
 * event loop per batch.
 */
export async function queryShaped<T> (db: Db, shape: string, build: () => SQL, values: Record<string, unknown>): Promise<T[]> {
  let built = shapes.get(shape)
  if (built === undefined) {
    built = dialect.sqlToQuery(build())
    shapes.set(shape, built)
  }
  return execute<T>(db, built, values)
}

/**
 * Whether a database's connections may run named statements, shared by its pool and every
 * connection of it (see setStatementPolicy). A database with none (PGlite) always may.
 */
export interface StatementPolicy {
  named: boolean
  /** Called when a named statement was found missing or doubled: `named` is false from then on. */
  onLost(err: unknown): void
}

const policies = new WeakMap<object, StatementPolicy>()

/**
 * Gives a driver client (a `pg.Pool`, or one of its connections) the policy of its database:
 * through a transaction pooler, the next transaction may run on another server connection,
 * which has never seen a name this connection prepared (26000), or has one of its own by that
 * name from another client (42P05).
 */
export function setStatementPolicy (client: object, policy: StatementPolicy): void {
  policies.set(client, policy)
}

/** "prepared statement … does not exist" and "… already exists": the statement's name is not this connection's. */
const STATEMENT_LOST = new Set(['26000', '42P05'])

/** True for a failure a named statement meets through a transaction pooler (transaction.ts retries its transaction). */
export function isStatementLost (err: unknown): boolean {
  const state = sqlState(err)
  return state !== undefined && STATEMENT_LOST.has(state)
}

// `db._.session`, its `client` and `prepareQuery(…, name, …)` are Drizzle's internals, not its
// API: package.json pins drizzle-orm to one exact version, so an upgrade is a deliberate change
// made with these lines (and test/db) in view.
async function execute<T> (db: Db, built: Query, values: Record<string, unknown>): Promise<T[]> {
  const client = (db._.session as unknown as { client?: object }).client
  const policy = client === undefined ? undefined : policies.get(client)
  if (policy?.named === false) return run<T>(db, built, values, undefined)
  const name = statementName(built.sql)
  try {
    return await run<T>(db, built, values, name)
  } catch (err) {
    if (policy === undefined || !isStatementLost(err)) throw err
    // A pooler nobody declared (DATABASE_POOLER): unnamed statements from here on, for every
    // connection of this database. The failure came at Parse or Bind, before anything ran: a
    // statement on its own (its own transaction) runs again at once; inside a transaction,
    // which the failure has aborted, the caller's retry runs the whole transaction again.
    if (policy.named) {
      policy.named = false
      policy.onLost(err)
    }
    if (db instanceof PgTransaction) throw err
    return run<T>(db, built, values, undefined)
  }
}

async function run<T> (db: Db, built: Query, values: Record<string, unknown>, name: string | undefined): Promise<T[]> {
  const result = await db._.session.prepareQuery(built, undefined, name, false).execute(values) as unknown as { rows: T[] }
  return result.rows
}
