import type { Query, SQL } from 'drizzle-orm'
import { PgDialect } from 'drizzle-orm/pg-core'
import type { Db } from './client.js'

/**
 * Runs raw SQL and returns its rows. Both drivers answer `{ rows }`, but the shared Drizzle
 * base type leaves the result untyped, so the one cast lives here.
 */
export async function queryRows<T> (db: Db, query: SQL): Promise<T[]> {
  const result = await db.execute(query) as unknown as { rows: T[] }
  return result.rows
}

const dialect = new PgDialect()
/** Statement names by SQL text: a handful of shapes, each named once for the process. */
const statementNames = new Map<string, string>()

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

async function execute<T> (db: Db, built: Query, values: Record<string, unknown>): Promise<T[]> {
  let name = statementNames.get(built.sql)
  if (name === undefined) {
    name = `parley_${statementNames.size + 1}`
    statementNames.set(built.sql, name)
  }
  const result = await db._.session.prepareQuery(built, undefined, name, false).execute(values) as unknown as { rows: T[] }
  return result.rows
}
