import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import { sql } from 'drizzle-orm'
import type { Database, Db } from './client.js'
import { ROOT } from '../paths.js'
import { queryRows } from './rows.js'

export const MIGRATIONS_FOLDER = join(ROOT, 'migrations')

// Any constant both `parley migrate` and every server agree on; "parley" in ASCII.
const MIGRATION_LOCK_KEY = 0x7061726c

interface JournalEntry { tag: string, when: number }

function readJournal (): JournalEntry[] {
  const journal = JSON.parse(readFileSync(`${MIGRATIONS_FOLDER}/meta/_journal.json`, 'utf8')) as { entries: JournalEntry[] }
  return journal.entries
}

/** The creation time of the newest migration this database has applied (0 when none). */
async function lastApplied (db: Db): Promise<number> {
  const [exists] = await queryRows<{ present: boolean }>(db,
    sql`SELECT to_regclass('drizzle.__drizzle_migrations') IS NOT NULL AS present`)
  if (exists?.present !== true) return 0
  const [last] = await queryRows<{ createdAt: string | null }>(db,
    sql`SELECT max(created_at)::text AS "createdAt" FROM drizzle.__drizzle_migrations`)
  return Number(last?.createdAt ?? 0)
}

/** Migrations in the folder that this database has not applied yet. */
export async function pendingMigrations (database: Database): Promise<string[]> {
  const last = await lastApplied(database.db)
  return readJournal().filter((m) => m.when > last).map((m) => m.tag)
}

/**
 * Applies pending migrations under an advisory lock, so two hosts running this at once apply
 * each migration exactly once; the second waits, then finds nothing to do. Returns the tags
 * this call applied (an empty list when the database was up to date).
 */
export async function migrateDatabase (database: Database): Promise<string[]> {
  return database.withLock(MIGRATION_LOCK_KEY, async (session) => {
    const before = await lastApplied(session.db)
    await session.migrate(MIGRATIONS_FOLDER)
    return readJournal().filter((m) => m.when > before).map((m) => m.tag)
  })
}
