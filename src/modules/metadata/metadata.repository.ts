import { eq } from 'drizzle-orm'
import type { Db } from '../../db/client.js'
import { metadata } from './metadata.table.js'

export interface MetadataMap {
  entity: string
  metadata: Record<string, unknown>
  updatedAt: string | null
}

export function createMetadataRepository (db: Db) {
  return {
    /**
     * Makes sure the entity's row exists, so a following `get(entity, true)` has a row to lock:
     * FOR UPDATE on a missing row locks nothing, and two first writes both merged into {} and
     * the later one dropped the other's keys (#14.1). The empty row commits with the merge, or
     * not at all.
     */
    async ensure (entity: string): Promise<void> {
      await db.insert(metadata).values({ entity, data: {} }).onConflictDoNothing({ target: metadata.entity })
    },

    async get (entity: string, lock = false): Promise<MetadataMap> {
      const query = db.select().from(metadata).where(eq(metadata.entity, entity))
      const [row] = lock ? await query.for('update') : await query
      return { entity, metadata: row?.data ?? {}, updatedAt: row?.updatedAt.toISOString() ?? null }
    },

    async put (entity: string, data: Record<string, unknown>): Promise<MetadataMap> {
      const now = new Date()
      await db.insert(metadata).values({ entity, data, updatedAt: now })
        .onConflictDoUpdate({ target: metadata.entity, set: { data, updatedAt: now } })
      return { entity, metadata: data, updatedAt: now.toISOString() }
    },

    /** Drops an entity's map; call it in the transaction that deletes the message or group. */
    async remove (entity: string): Promise<void> {
      await db.delete(metadata).where(eq(metadata.entity, entity))
    }
  }
}
