import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import type { Db } from '../../db/client.js'
import { transaction } from '../../db/retry.js'
import { Forbidden, ValidationFailed } from '../../errors.js'
import { principalOf } from '../../plugins/auth.js'
import { AUTHENTICATED_ERRORS, errorResponses } from '../../schemas.js'
import { visibleEntity } from '../entities.js'
import { createMetadataRepository } from './metadata.repository.js'
import { EntityParams, MetadataPatch, MetadataSchema } from './metadata.schemas.js'

export const MAX_METADATA_KEYS = 64
export const MAX_METADATA_BYTES = 16 * 1024
const KEY = /^[A-Za-z0-9._-]{1,64}$/

/** Applies a patch to a map: null deletes, anything else sets. */
function merge (current: Record<string, unknown>, patch: Record<string, unknown>): Record<string, unknown> {
  const next: Record<string, unknown> = { ...current }
  for (const [key, value] of Object.entries(patch)) {
    if (value === null) delete next[key]
    else next[key] = value
  }
  return next
}

export const metadataRoutes: FastifyPluginAsyncTypebox<{ db: Db }> = async (app, { db }) => {
  app.get('/metadata/:entity', {
    schema: {
      tags: ['metadata'],
      summary: 'Read an entity\'s metadata',
      description: 'For anyone who may see the entity: users by everyone, groups by members, messages by sender and recipients.',
      params: EntityParams,
      response: { 200: MetadataSchema, ...errorResponses(...AUTHENTICATED_ERRORS, 403, 404) }
    }
  }, async (req) => {
    const entity = await visibleEntity(db, req.params.entity, principalOf(req).address)
    return createMetadataRepository(db).get(entity.id)
  })

  app.post('/metadata/:entity', {
    schema: {
      tags: ['metadata'],
      summary: 'Merge into an entity\'s metadata',
      description: `Only the owner writes: a user its own, a group its owner, a message its sender. At most ${MAX_METADATA_KEYS} keys ` +
        `and ${MAX_METADATA_BYTES} bytes of JSON per entity.`,
      params: EntityParams,
      body: MetadataPatch,
      response: { 200: MetadataSchema, ...errorResponses(...AUTHENTICATED_ERRORS, 403, 404) }
    }
  }, async (req) => {
    const me = principalOf(req).address
    const badKey = Object.keys(req.body).find((key) => !KEY.test(key))
    if (badKey !== undefined) {
      throw new ValidationFailed(`metadata key ${JSON.stringify(badKey.slice(0, 80))}: keys are 1-64 characters of A-Z a-z 0-9 . _ -`)
    }
    const entity = await visibleEntity(db, req.params.entity, me)
    if (entity.owner !== me) throw new Forbidden(`only the owner of ${entity.kind} ${entity.id} may change its metadata`)
    return transaction(db, async (tx) => {
      const repository = createMetadataRepository(tx)
      await repository.ensure(entity.id)
      const next = merge((await repository.get(entity.id, true)).metadata, req.body)
      if (Object.keys(next).length > MAX_METADATA_KEYS) {
        throw new ValidationFailed(`metadata: at most ${MAX_METADATA_KEYS} keys per entity`)
      }
      if (Buffer.byteLength(JSON.stringify(next)) > MAX_METADATA_BYTES) {
        throw new ValidationFailed(`metadata: at most ${MAX_METADATA_BYTES} bytes of JSON per entity`)
      }
      return repository.put(entity.id, next)
    })
  })
}
