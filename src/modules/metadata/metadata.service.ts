import type { Db } from '../../db/client.js'
import { transaction } from '../../db/transaction.js'
import { Forbidden, ValidationFailed } from '../../errors.js'
import { visibleEntity } from '../entities.js'
import { createMetadataRepository } from './metadata.repository.js'
import type { Metadata } from './metadata.schemas.js'

export const MAX_METADATA_KEYS = 64
export const MAX_METADATA_BYTES = 16 * 1024

/** Applies a patch to a map: null deletes, anything else sets. */
function merge (current: Record<string, unknown>, patch: Record<string, unknown>): Record<string, unknown> {
  const next: Record<string, unknown> = { ...current }
  for (const [key, value] of Object.entries(patch)) {
    if (value === null) delete next[key]
    else next[key] = value
  }
  return next
}

/** An entity's map, for anyone who may see the entity (unknown 404, not visible 403). */
export async function readMetadata (db: Db, entity: string, viewer: string): Promise<Metadata> {
  const visible = await visibleEntity(db, entity, viewer)
  return createMetadataRepository(db).get(visible.id)
}

/**
 * Merges a patch into an entity's map and answers the whole map. Only the owner writes: a user
 * its own, a group its owner, a message its sender. The merged map must fit MAX_METADATA_KEYS
 * and MAX_METADATA_BYTES of JSON; it is read locked and written in one transaction, so racing
 * merges each keep the other's keys.
 */
export async function mergeMetadata (db: Db, entity: string, writer: string, patch: Record<string, unknown>): Promise<Metadata> {
  const owned = await visibleEntity(db, entity, writer)
  if (owned.owner !== writer) throw new Forbidden(`only the owner of ${owned.kind} ${owned.id} may change its metadata`)
  return transaction(db, async (tx) => {
    const repository = createMetadataRepository(tx)
    await repository.ensure(owned.id)
    const next = merge((await repository.get(owned.id, true)).metadata, patch)
    if (Object.keys(next).length > MAX_METADATA_KEYS) {
      throw new ValidationFailed(`metadata: at most ${MAX_METADATA_KEYS} keys per entity`)
    }
    if (Buffer.byteLength(JSON.stringify(next)) > MAX_METADATA_BYTES) {
      throw new ValidationFailed(`metadata: at most ${MAX_METADATA_BYTES} bytes of JSON per entity`)
    }
    return repository.put(owned.id, next)
  })
}
