import { createHash } from 'node:crypto'
import type { SQL } from 'drizzle-orm'
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

/**
 * queryRows() as a named prepared statement, for the hottest statements: PostgreSQL parses and
 * plans it once per connection instead of on every call (for a send, about half of the
 * database's work). The name is a hash of the SQL text, so each distinct shape of a statement
 * gets its own and one name never means two texts.
 */
export async function queryPrepared<T> (db: Db, query: SQL): Promise<T[]> {
  const built = dialect.sqlToQuery(query)
  const name = `parley_${createHash('sha1').update(built.sql).digest('hex').slice(0, 20)}`
  const result = await db._.session.prepareQuery(built, undefined, name, false).execute() as unknown as { rows: T[] }
  return result.rows
}
