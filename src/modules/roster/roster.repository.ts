import { and, asc, eq, inArray, sql } from 'drizzle-orm'
import type { TimeCursor } from '../../cursors.js'
import type { Db } from '../../db/client.js'
import type { RosterEntry } from './roster.schemas.js'
import { rosterEntries, type RosterRow } from './roster.table.js'

export function toRosterEntry (row: RosterRow): RosterEntry {
  return { entity: row.entity, type: row.type, name: row.name, addedAt: row.addedAt.toISOString() }
}

export function createRosterRepository (db: Db) {
  return {
    /** Up to `limit` entries of `owner`'s roster, oldest first, after the entry `after` names (keyset: its time and entity). */
    async page (owner: string, after: TimeCursor | undefined, limit: number): Promise<RosterRow[]> {
      return db.select().from(rosterEntries)
        .where(and(eq(rosterEntries.owner, owner),
          after === undefined ? undefined : sql`(${rosterEntries.addedAt}, ${rosterEntries.entity}) > (${after.at}::timestamptz, ${after.id})`))
        .orderBy(asc(rosterEntries.addedAt), asc(rosterEntries.entity))
        .limit(limit)
    },

    /** Adds an entry, or renames one already there (a missing name keeps the old one). */
    async upsert (owner: string, entity: string, type: 'user' | 'group', name: string | undefined): Promise<RosterRow> {
      const [row] = await db.insert(rosterEntries).values({ owner, entity, type, name: name ?? null })
        .onConflictDoUpdate({
          target: [rosterEntries.owner, rosterEntries.entity],
          set: { name: name === undefined ? sql`${rosterEntries.name}` : name }
        })
        .returning()
      return row!
    },

    /** Erasure: up to `limit` entries of `owner`'s roster, removed; answers how many. */
    async removeOwnedBy (owner: string, limit: number): Promise<number> {
      const some = db.select({ entity: rosterEntries.entity }).from(rosterEntries).where(eq(rosterEntries.owner, owner)).limit(limit)
      const gone = await db.delete(rosterEntries).where(and(eq(rosterEntries.owner, owner), inArray(rosterEntries.entity, some)))
        .returning({ entity: rosterEntries.entity })
      return gone.length
    },

    /** Removes an entry; false when it was not there. */
    async remove (owner: string, entity: string): Promise<boolean> {
      const gone = await db.delete(rosterEntries).where(and(eq(rosterEntries.owner, owner), eq(rosterEntries.entity, entity)))
        .returning({ entity: rosterEntries.entity })
      return gone.length > 0
    }
  }
}
