import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import type { Db } from '../../db/client.js'
import { NotFound, ValidationFailed } from '../../errors.js'
import { isGroupId, normalizeAddress } from '../../ids.js'
import { principalOf } from '../../plugins/auth.js'
import { AUTHENTICATED_ERRORS, errorResponses, NoContent } from '../../schemas.js'
import { entityKind, visibleEntity } from '../entities.js'
import { createRosterRepository, toRosterEntry } from './roster.repository.js'
import { AddRosterEntryBody, RosterEntrySchema, RosterParams, RosterSchema } from './roster.schemas.js'

export const rosterRoutes: FastifyPluginAsyncTypebox<{ db: Db }> = async (app, { db }) => {
  const roster = createRosterRepository(db)

  app.get('/roster', {
    schema: {
      tags: ['roster'],
      summary: 'The caller\'s contact list',
      response: { 200: RosterSchema, ...errorResponses(...AUTHENTICATED_ERRORS) }
    }
  }, async (req) => ({ entries: (await roster.list(principalOf(req).address)).map(toRosterEntry) }))

  app.post('/roster', {
    schema: {
      tags: ['roster'],
      summary: 'Add or rename a contact',
      description: 'A user, or a group the caller is a member of. Adding an entity already there renames it.',
      body: AddRosterEntryBody,
      response: { 200: RosterEntrySchema, ...errorResponses(...AUTHENTICATED_ERRORS, 403, 404) }
    }
  }, async (req) => {
    const me = principalOf(req).address
    if (entityKind(req.body.entity) === 'message') throw new ValidationFailed('entity: a roster holds users and groups, not messages')
    const entity = await visibleEntity(db, req.body.entity, me)
    return toRosterEntry(await roster.upsert(me, entity.id, entity.kind === 'group' ? 'group' : 'user', req.body.name))
  })

  app.delete('/roster/:entity', {
    schema: {
      tags: ['roster'],
      summary: 'Remove a contact',
      params: RosterParams,
      response: { 204: NoContent, ...errorResponses(...AUTHENTICATED_ERRORS, 404) }
    }
  }, async (req, reply) => {
    const entity = isGroupId(req.params.entity) ? req.params.entity : normalizeAddress(req.params.entity)
    if (!await roster.remove(principalOf(req).address, entity)) throw new NotFound('roster entry', entity)
    return reply.code(204).send()
  })
}
