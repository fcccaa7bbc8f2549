import { sql, type SQL } from 'drizzle-orm'
import type { Db } from '../db/client.js'
import { queryRows } from '../db/rows.js'
import { createSettingsRepository } from '../db/settings.repository.js'
import { transaction } from '../db/transaction.js'
import { rest } from '../rest.js'
import { keyring } from './keyring.js'
import { SEALED_TABLES, type Cursor, type PageOutcome, type SealedTable } from './reseal-tables.js'

/**
 * The sealing pass: one engine for sealing what was written before sealing (`plain`: rows
 * whose sealed_by is NULL; `parley migrate` and every start) and for rotation (`rotate`: also
 * rows under any configured key but the active one; `parley seal rotate`). Online: each page
 * of a table is its own short transaction, with a rest after it as long as it took, so the
 * service's own work gets the database at least half the time. Resumable: it keeps no state,
 * every run finds what remains, so a kill loses one page's work at most. Rows under a key no
 * longer configured are left alone (they answer 503 SEALED_KEY_MISSING until it is back).
 */

// "parley seal": one page at a time across instances and commands (retention's idea, a lock of its own).
const SEAL_LOCK_KEY = 0x7365616c
/** Tries at the lock before a page waits longer: another pass's page holds it for a moment only. */
const LOCK_RETRY_MS = 50
/** Rounds over a table at most: a round after the first takes only rows a concurrent write made it skip. */
const MAX_ROUNDS = 5
const MAX_REST_MS = 1_000
const MIN_REST_MS = 5

export type SealMode = 'plain' | 'rotate'

interface SealProgress {
  table: string
  /** Rows sealed so far, all tables. */
  done: number
  /** Rows there were to seal when the pass began, all tables (rows written since may add a few). */
  total: number
}

export interface SealPassOptions {
  mode: SealMode
  /** Stops the pass between two pages (shutdown). */
  signal?: AbortSignal
  onProgress?: (progress: SealProgress) => void
  /** Rest between pages as long as each took (default); false for a pass nobody waits beside. */
  rest?: boolean
}

export interface SealPassResult {
  /** Rows sealed under the active key. */
  sealed: number
  /** Per table, rows sealed. */
  tables: Record<string, number>
  /** Records that do not open under their own key: left as they are. */
  broken: string[]
  /** Rows a concurrent write kept changing through every round: the next run takes them. */
  skipped: number
  /** True when the signal stopped the pass before its end. */
  stopped: boolean
}

/** What a pass re-seals: plain rows, and in rotation rows under the other configured keys. */
function pendingRows (mode: SealMode): SQL {
  const ring = keyring()
  const older = ring.ids.filter((id) => id !== ring.active)
  if (mode === 'plain' || older.length === 0) return sql`sealed_by IS NULL`
  return sql`(sealed_by IS NULL OR sealed_by = ANY(${sql.param(older)}::text[]))`
}

/** Rows the pass would re-seal now, per table. */
export async function countPending (db: Db, mode: SealMode): Promise<Record<string, number>> {
  const counts: Record<string, number> = {}
  for (const table of SEALED_TABLES) {
    const [row] = await queryRows<{ n: number }>(db, sql`
      SELECT count(*)::int AS n FROM ${sql.identifier(table.name)} WHERE (${table.scope}) AND ${pendingRows(mode)}`)
    counts[table.name] = row?.n ?? 0
  }
  return counts
}

/** One page under the lock; undefined while another pass's page holds it (then it is tried again). */
async function sealPage (db: Db, table: SealedTable, pending: SQL, after: Cursor | undefined, signal: AbortSignal | undefined): Promise<PageOutcome | undefined> {
  for (;;) {
    const page = await transaction(db, async (tx) => await createSettingsRepository(tx).tryLock(SEAL_LOCK_KEY) ? table.page(tx, pending, after) : undefined)
    if (page !== undefined || signal?.aborted === true) return page
    await rest(LOCK_RETRY_MS, signal)
  }
}

export async function runSealingPass (db: Db, options: SealPassOptions): Promise<SealPassResult> {
  const { signal } = options
  const result: SealPassResult = { sealed: 0, tables: {}, broken: [], skipped: 0, stopped: false }
  const counts = await countPending(db, options.mode)
  const total = Object.values(counts).reduce((sum, n) => sum + n, 0)
  for (const table of SEALED_TABLES) {
    result.tables[table.name] = 0
    if (counts[table.name] === 0) continue
    const pending = sql`(${table.scope}) AND ${pendingRows(options.mode)}`
    let skipped = 0
    for (let round = 0; round < MAX_ROUNDS; round++) {
      skipped = 0
      const broken = new Set(result.broken)
      let after: Cursor | undefined
      do {
        const started = performance.now()
        const page = await sealPage(db, table, pending, after, signal)
        if (page === undefined) {
          result.stopped = true
          return result
        }
        result.sealed += page.sealed
        result.tables[table.name]! += page.sealed
        skipped += page.skipped
        for (const name of page.broken) broken.add(name)
        options.onProgress?.({ table: table.name, done: result.sealed, total: Math.max(total, result.sealed) })
        after = page.next
        if (signal?.aborted === true) {
          result.stopped = true
          return result
        }
        if (after !== undefined && options.rest !== false) {
          await rest(Math.min(MAX_REST_MS, Math.max(MIN_REST_MS, performance.now() - started)), signal)
        }
      } while (after !== undefined)
      result.broken = [...broken]
      if (skipped === 0) break
    }
    result.skipped += skipped
  }
  return result
}
