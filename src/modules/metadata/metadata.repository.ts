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
    }
  }
}
