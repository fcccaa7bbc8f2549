import { eq, inArray } from 'drizzle-orm'
import type { Db } from '../../db/client.js'
import { openJson, record, sealJson } from '../../sealing/records.js'
import type { Metadata } from './metadata.schemas.js'
import { metadata, type MetadataRow } from './metadata.table.js'

/**
 * A stored row's map, opened. The map is sealed whole (API.md §11: values are what users say),
 * so the database cannot look inside it: whatever reads a key or tests for an empty map does it
 * here, in Node, from this. A row written before sealing (sealed_by NULL) is the map as it is.
 */
export function metadataMap (row: Pick<MetadataRow, 'entity' | 'data' | 'sealedBy'>): Record<string, unknown> {
  return openJson<Record<string, unknown>>(row.data, record.metadata(row.entity), row.sealedBy)
}

/** An entity's map from its row; an entity never written has none, and an empty map. */
function toMetadata (entity: string, row: MetadataRow | undefined): Metadata {
  return { entity, metadata: row === undefined ? {} : metadataMap(row), updatedAt: row?.updatedAt.toISOString() ?? null }
}

export function createMetadataRepository (db: Db) {
  return {
    /**
     * Makes sure the entity's row exists, so a following `get(entity, true)` has a row to lock:
     * FOR UPDATE on a missing row locks nothing, and two first writes both merged into {} and
     * the later one dropped the other's keys (#14.1). The empty row commits with the merge, or
     * not at all; an empty map says nothing, so it is written plain.
     */
    async ensure (entity: string): Promise<void> {
      await db.insert(metadata).values({ entity, data: {} }).onConflictDoNothing({ target: metadata.entity })
    },

    async get (entity: string, lock = false): Promise<Metadata> {
      const query = db.select().from(metadata).where(eq(metadata.entity, entity))
      const [row] = lock ? await query.for('update') : await query
      return toMetadata(entity, row)
    },

    /** Writes the entity's whole map, sealed under the active key. */
    async put (entity: string, data: Record<string, unknown>): Promise<Metadata> {
      const now = new Date()
      const { sealed, sealedBy } = sealJson(data, record.metadata(entity))
      await db.insert(metadata).values({ entity, data: sealed, sealedBy, updatedAt: now })
        .onConflictDoUpdate({ target: metadata.entity, set: { data: sealed, sealedBy, updatedAt: now } })
      return { entity, metadata: data, updatedAt: now.toISOString() }
    },

    /** Drops entities' maps; call it in the transaction that deletes the messages or group. Answers how many there were. */
    async remove (...entities: string[]): Promise<number> {
      if (entities.length === 0) return 0
      const gone = await db.delete(metadata).where(entities.length === 1 ? eq(metadata.entity, entities[0]!) : inArray(metadata.entity, entities))
        .returning({ entity: metadata.entity })
      return gone.length
    }
  }
}
