import { sql } from 'drizzle-orm'
import type { Db } from '../db/client.js'
import { queryRows } from '../db/rows.js'
import { SEALED_TABLES } from './reseal-tables.js'

/** Idempotency records are kept this long (retention purges them after): see idempotencyKeysLeft. */
const IDEMPOTENCY_TTL_MS = 24 * 60 * 60 * 1000

interface TableStatus {
  table: string
  /** Rows written before sealing, still plain. */
  plain: number
  /** Rows by the id of the key they are sealed under. */
  byKey: Record<string, number>
}

/**
 * Idempotency records by key: their request hash is a keyed tag that cannot be computed anew
 * without the request, so rotation leaves them to expire; `until` is when the last one does.
 */
interface IdempotencyStatus {
  plain: number
  byKey: Record<string, { records: number, until: string }>
}

export interface SealStatus {
  tables: TableStatus[]
  idempotencyKeys: IdempotencyStatus
}

/** How many records each table holds plain and under each key id (`parley seal status`). */
export async function sealStatus (db: Db): Promise<SealStatus> {
  const tables: TableStatus[] = []
  for (const table of SEALED_TABLES) {
    const rows = await queryRows<{ sealed_by: string | null, n: number }>(db, sql`
      SELECT sealed_by, count(*)::int AS n FROM ${sql.identifier(table.name)} WHERE ${table.scope} GROUP BY sealed_by`)
    const status: TableStatus = { table: table.name, plain: 0, byKey: {} }
    for (const row of rows) {
      if (row.sealed_by === null) status.plain = row.n
      else status.byKey[row.sealed_by] = row.n
    }
    tables.push(status)
  }
  const idempotency: IdempotencyStatus = { plain: 0, byKey: {} }
  const rows = await queryRows<{ sealed_by: string | null, n: number, newest: string }>(db, sql`
    SELECT sealed_by, count(*)::int AS n, max(created_at)::text AS newest FROM idempotency_keys GROUP BY sealed_by`)
  for (const row of rows) {
    if (row.sealed_by === null) idempotency.plain = row.n
    else idempotency.byKey[row.sealed_by] = { records: row.n, until: new Date(new Date(row.newest).getTime() + IDEMPOTENCY_TTL_MS).toISOString() }
  }
  return { tables, idempotencyKeys: idempotency }
}

/** Every key id the status names, the tables' and the idempotency records', in first-seen order. */
export function keyIdsIn (status: SealStatus): string[] {
  const ids = new Set<string>()
  for (const table of status.tables) for (const id of Object.keys(table.byKey)) ids.add(id)
  for (const id of Object.keys(status.idempotencyKeys.byKey)) ids.add(id)
  return [...ids]
}

export interface KeyVerdict {
  keyId: string
  /** Records of the sealed tables still under it: the key is needed until rotation moves them. */
  records: number
  /** Idempotency records under it, and when the last expires (ISO); undefined: none. */
  idempotencyUntil: string | undefined
}

/** For each configured key but the active one: what still needs it (`parley seal rotate`'s last words). */
export function retiringKeys (status: SealStatus, configured: readonly string[], active: string): KeyVerdict[] {
  return configured.filter((id) => id !== active).map((keyId) => ({
    keyId,
    records: status.tables.reduce((sum, table) => sum + (table.byKey[keyId] ?? 0), 0),
    idempotencyUntil: status.idempotencyKeys.byKey[keyId]?.until
  }))
}
