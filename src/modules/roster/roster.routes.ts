import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import { decodeTimeCursor, encodeTimeCursor } from '../../cursors.js'
import type { Db } from '../../db/client.js'
import { NotFound, ValidationFailed } from '../../errors.js'
import { isAddress, isGroupId, normalizeAddress } from '../../ids.js'
import { principalOf } from '../../plugins/auth.js'
import { AUTHENTICATED_ERRORS, errorResponses, NoContent } from '../../schemas.js'
import { entityKind, visibleEntity } from '../entities.js'
import { createRosterRepository, toRosterEntry } from './roster.repository.js'
import { AddRosterEntryBody, ListRosterQuery, RosterEntrySchema, RosterParams, RosterSchema } from './roster.schemas.js'

export const rosterRoutes: FastifyPluginAsyncTypebox<{ db: Db }> = async (app, { db }) => {
  const roster = createRosterRepository(db)

  app.get('/roster', {
    schema: {
      operationId: 'listRoster',
      tags: ['roster'],
      summary: 'The caller\'s contact list',
      description: 'Oldest entry first, cursor-paged: `limit` (1-200, default 50) entries a page, and `nextCursor` to pass ' +
        'as `cursor` for the next (null on the last). Without a cursor, the first page.',
      querystring: ListRosterQuery,
      response: { 200: RosterSchema, ...errorResponses(...AUTHENTICATED_ERRORS) }
    }
  }, async (req) => {
    const limit = req.query.limit ?? 50
    const after = req.query.cursor === undefined ? undefined : decodeTimeCursor(req.query.cursor, (id) => isAddress(id) || isGroupId(id))
    const rows = await roster.page(principalOf(req).address, after, limit + 1)
    const page = rows.slice(0, limit)
    const last = page.at(-1)
    return {
      entries: page.map(toRosterEntry),
      nextCursor: rows.length > limit && last !== undefined ? encodeTimeCursor({ at: last.addedAt.toISOString(), id: last.entity }) : null
    }
  })

  app.post('/roster', {
    schema: {
      operationId: 'putRosterEntry',
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
      operationId: 'deleteRosterEntry',
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
