import { and, asc, desc, eq, inArray, isNull, lt, sql } from 'drizzle-orm'
import type { Db } from '../../db/client.js'
import type { AuditAction, AuditActor, AuditEntry } from './audit.schemas.js'
import { auditLog, type AuditRow } from './audit.table.js'

export interface NewAuditEntry {
  actor: AuditActor
  action: AuditAction
  target: string
  requestId: string | null
  ip: string | null
}

/** Which entries a page holds: each filter given narrows it (case-insensitively: addresses and ids are lower-case). */
export interface AuditFilter {
  /** A key id (key_…), a user address, or 'cli'. */
  actor?: string | undefined
  action?: AuditAction | undefined
  target?: string | undefined
}

export function toAuditEntry (row: AuditRow): AuditEntry {
  return {
    id: String(row.id),
    at: row.at.toISOString(),
    actor: row.actorKeyId === null ? 'cli' : { key: row.actorKeyId, address: row.actorAddress ?? '' },
    action: row.action,
    target: row.target,
    requestId: row.requestId,
    ip: row.ip
  }
}

function actorIs (given: string) {
  const actor = given.toLowerCase()
  if (actor === 'cli') return isNull(auditLog.actorKeyId)
  return actor.startsWith('key_') ? eq(auditLog.actorKeyId, actor) : eq(auditLog.actorAddress, actor)
}

/** Appends to the audit log and reads it; nothing here changes an entry, and only retention deletes one. */
export function createAuditRepository (db: Db) {
  return {
    /** Run inside the transaction of the change it records, so the two commit together or not at all. */
    async record (entry: NewAuditEntry): Promise<void> {
      await db.insert(auditLog).values({
        actorKeyId: entry.actor === 'cli' ? null : entry.actor.key,
        actorAddress: entry.actor === 'cli' ? null : entry.actor.address,
        action: entry.action,
        target: entry.target,
        requestId: entry.requestId,
        ip: entry.ip
      })
    },

    /** Up to `limit` entries, newest first, older than the entry `before` (its id), that pass the filter. */
    async page (filter: AuditFilter, before: number | undefined, limit: number): Promise<AuditRow[]> {
      return db.select().from(auditLog)
        .where(and(
          filter.actor === undefined ? undefined : actorIs(filter.actor),
          filter.action === undefined ? undefined : eq(auditLog.action, filter.action),
          filter.target === undefined ? undefined : eq(auditLog.target, filter.target.toLowerCase()),
          before === undefined ? undefined : lt(auditLog.id, before)
        ))
        .orderBy(desc(auditLog.id))
        .limit(limit)
    },

    /**
     * Retention: at most `batch` of the oldest entries older than `days` days, so that one
     * statement never holds many rows; the number deleted (`batch` means there may be more).
     */
    async purge (days: number, batch: number): Promise<number> {
      const oldest = db.select({ id: auditLog.id }).from(auditLog)
        .where(lt(auditLog.at, sql`now() - make_interval(days => ${days})`))
        .orderBy(asc(auditLog.at))
        .limit(batch)
      const gone = await db.delete(auditLog).where(inArray(auditLog.id, oldest)).returning({ id: auditLog.id })
      return gone.length
    }
  }
}
