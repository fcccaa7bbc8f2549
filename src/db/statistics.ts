import type { FastifyBaseLogger } from 'fastify'
import { sql } from 'drizzle-orm'
import type { Database, Db } from './client.js'
import { loggableError } from './errors.js'
import { queryRows } from './rows.js'

/**
 * A table's statistics are taken as out of date when its file holds this much more than the
 * planner was last told (pg_class.relpages, set by ANALYZE, VACUUM and CREATE INDEX), and at
 * least GREW_PAGES more: PostgreSQL's autovacuum analyzes after 10 % of a table changes.
 */
const GREW_BY = 1.2
const GREW_PAGES = 8
/**
 * How often the embedded database's tables are looked at again. PGlite runs PostgreSQL in
 * single-user mode: there is no autovacuum and no activity counter, so nothing else would ever
 * tell the planner that a table grew. An ANALYZE reads a sample of at most 30,000 rows (150 ms
 * for 300,000 messages, 73 MB, on PGlite), and holds the one connection while it runs.
 */
const EMBEDDED_EVERY_MS = 10 * 60_000

interface TableSize {
  schema: string
  table: string
  /** Pages and rows the planner was last told of (-1 rows: never counted). */
  planned: number
  plannedRows: number
  /** Pages the table's file holds now. */
  pages: number
  /** Whether any of its columns has statistics (an empty table analyzed has none, and needs none). */
  described: boolean
}

/**
 * The tables of the service's schema (its own: the role owns them) whose planner statistics
 * are missing or behind: a table with rows and no statistics at all (a database restored from a
 * dump, or upgraded by pg_upgrade: neither carries them), or one grown well past what the
 * planner was told (a database cloned from a template carries the template's, however old). A
 * table whose rows are all gone keeps its pages (the embedded database never vacuums) and gets
 * no statistics from an ANALYZE: it is up to date once one has counted it empty. Without
 * statistics the planner took `users` for a one-row table (its size when its index was made)
 * and a send's batch read every user once per recipient: 4.1 ms a batch of nine with 1,050
 * users, against 1.0 ms analyzed.
 */
async function staleTables (db: Db): Promise<TableSize[]> {
  const sizes = await queryRows<TableSize>(db, sql`
    SELECT n.nspname AS schema, c.relname AS "table", c.relpages AS planned, c.reltuples::float8 AS "plannedRows",
      (pg_relation_size(c.oid) / current_setting('block_size')::int)::int AS pages,
      EXISTS (SELECT 1 FROM pg_stats s WHERE s.schemaname = n.nspname AND s.tablename = c.relname) AS described
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = current_schema() AND c.relkind = 'r' AND pg_has_role(c.relowner, 'MEMBER')
    ORDER BY c.relname`)
  return sizes.filter(({ planned, plannedRows, pages, described }) => {
    if (pages >= GREW_BY * planned + GREW_PAGES) return true
    const countedEmpty = plannedRows === 0 && pages <= planned
    return pages > 0 && !described && !countedEmpty
  })
}

/**
 * Analyzes the stale tables, one statement each, skipping a table another session holds (a
 * migration's ALTER, another instance's ANALYZE) rather than queueing every later statement on
 * it behind that holder (it counts as analyzed: the next pass, or start, looks again); a table
 * that fails is skipped and the next one tried. The tables analyzed.
 */
export async function analyzeStaleTables (db: Db, signal?: AbortSignal, onError?: (err: unknown, table: string) => void): Promise<string[]> {
  const analyzed: string[] = []
  for (const { schema, table } of await staleTables(db)) {
    if (signal?.aborted === true) break
    try {
      await db.execute(sql`ANALYZE (SKIP_LOCKED) ${sql.identifier(schema)}.${sql.identifier(table)}`)
      analyzed.push(table)
    } catch (err) {
      onError?.(err, table)
    }
  }
  return analyzed
}

/**
 * Keeps the planner's statistics up to date where nothing else does: at start, in the
 * background, the tables whose statistics are missing or behind (see staleTables); on the
 * embedded database, again every EMBEDDED_EVERY_MS, since it has no autovacuum. On PostgreSQL
 * autovacuum does the rest. One line each time it analyzed anything. The function returned stops
 * it after its current table and resolves when it has.
 */
export function startStatisticsUpkeep (database: Database, log: FastifyBaseLogger): () => Promise<void> {
  const stopping = new AbortController()
  let running: Promise<void> | undefined
  // A table that fails is named; the look-up's own failure is not a table's.
  const failed = (err: unknown, table?: string): void => {
    if (!stopping.signal.aborted) log.warn({ table, err: loggableError(err) }, 'could not analyze tables whose planner statistics are missing or behind; their plans may be slow until autovacuum analyzes them')
  }
  const pass = (): void => {
    if (running !== undefined) return
    const started = performance.now()
    running = analyzeStaleTables(database.db, stopping.signal, failed).then((tables) => {
      if (tables.length > 0) {
        log.info({ tables, ms: Math.round(performance.now() - started) },
          'analyzed tables whose planner statistics were missing or behind (a restored, cloned or upgraded database; the embedded database has no autovacuum)')
      }
    }, (err: unknown) => { failed(err) }).finally(() => { running = undefined })
  }
  pass()
  const timer = database.driver === 'pglite' ? setInterval(pass, EMBEDDED_EVERY_MS).unref() : undefined
  return async () => {
    stopping.abort()
    clearInterval(timer)
    await running
  }
}
