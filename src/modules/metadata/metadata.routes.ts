import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import type { Db } from '../../db/client.js'
import { ValidationFailed } from '../../errors.js'
import { principalOf } from '../../plugins/auth.js'
import { AUTHENTICATED_ERRORS, errorResponses } from '../../schemas.js'
import { EntityParams, MetadataPatch, MetadataSchema } from './metadata.schemas.js'
import { MAX_METADATA_BYTES, MAX_METADATA_KEYS, mergeMetadata, readMetadata } from './metadata.service.js'

const KEY = /^[A-Za-z0-9._-]{1,64}$/

export const metadataRoutes: FastifyPluginAsyncTypebox<{ db: Db }> = async (app, { db }) => {
  app.get('/metadata/:entity', {
    schema: {
      operationId: 'getMetadata',
      tags: ['metadata'],
      summary: 'Read an entity\'s metadata',
      description: 'For anyone who may see the entity: users by everyone, groups by members, messages by sender and recipients.',
      params: EntityParams,
      response: { 200: MetadataSchema, ...errorResponses(...AUTHENTICATED_ERRORS, 403, 404) }
    }
  }, async (req) => readMetadata(db, req.params.entity, principalOf(req).address))

  app.post('/metadata/:entity', {
    schema: {
      operationId: 'updateMetadata',
      tags: ['metadata'],
      summary: 'Merge into an entity\'s metadata',
      description: `Only the owner writes: a user its own, a group its owner, a message its sender. At most ${MAX_METADATA_KEYS} keys ` +
        `and ${MAX_METADATA_BYTES} bytes of JSON per entity.`,
      params: EntityParams,
      body: MetadataPatch,
      response: { 200: MetadataSchema, ...errorResponses(...AUTHENTICATED_ERRORS, 403, 404) }
    }
  }, async (req) => {
    const badKey = Object.keys(req.body).find((key) => !KEY.test(key))
    if (badKey !== undefined) {
      throw new ValidationFailed(`metadata key ${JSON.stringify(badKey.slice(0, 80))}: keys are 1-64 characters of A-Z a-z 0-9 . _ -`)
    }
    return mergeMetadata(db, req.params.entity, principalOf(req).address, req.body)
  })
}
