import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import type { Db } from '../../db/client.js'
import { principalOf } from '../../plugins/auth.js'
import { AUTHENTICATED_ERRORS, errorResponses, NoContent } from '../../schemas.js'
import { CreateGroupBody, GroupParams, GroupSchema, MembersBody, RenameGroupBody } from './groups.schemas.js'
import { addGroupMembers, createGroup, deleteGroup, readGroup, removeGroupMembers, renameGroup } from './groups.service.js'

export const groupsRoutes: FastifyPluginAsyncTypebox<{ db: Db, maxGroupMembers: number }> = async (app, { db, maxGroupMembers }) => {
  const answers = (...statuses: number[]) => ({ 200: GroupSchema, ...errorResponses(...AUTHENTICATED_ERRORS, ...statuses) })

  app.post('/group', {
    config: { admission: 'heavy' },
    schema: {
      operationId: 'createGroup',
      tags: ['groups'],
      summary: 'Create a group',
      description: 'The caller becomes its owner and a member. Every member gets group.created.',
      body: CreateGroupBody,
      response: answers(404)
    }
  }, async (req) => createGroup(db, maxGroupMembers, principalOf(req).address, req.body.name, req.body.members ?? []))

  app.get('/group/:group', {
    schema: { operationId: 'getGroup', tags: ['groups'], summary: 'Read a group', description: 'Members only.', params: GroupParams, response: answers(403, 404) }
  }, async (req) => readGroup(db, req.params.group, principalOf(req).address))

  app.post('/group/:group', {
    config: { admission: 'heavy' },
    schema: {
      operationId: 'renameGroup',
      tags: ['groups'],
      summary: 'Rename a group',
      description: 'Owner only. Every member gets group.updated.',
      params: GroupParams,
      body: RenameGroupBody,
      response: answers(403, 404)
    }
  }, async (req) => renameGroup(db, req.params.group, principalOf(req).address, req.body.name))

  app.delete('/group/:group', {
    config: { admission: 'heavy' },
    schema: {
      operationId: 'deleteGroup',
      tags: ['groups'],
      summary: 'Delete a group',
      description: 'Owner only. Every member gets group.deleted.',
      params: GroupParams,
      response: { 204: NoContent, ...errorResponses(...AUTHENTICATED_ERRORS, 403, 404) }
    }
  }, async (req, reply) => {
    await deleteGroup(db, req.params.group, principalOf(req).address)
    return reply.code(204).send()
  })

  app.post('/group/:group/members', {
    config: { admission: 'heavy' },
    schema: {
      operationId: 'addGroupMembers',
      tags: ['groups'],
      summary: 'Add members',
      description: 'Owner only; unknown addresses 404. Every member gets group.members_added with those newly added.',
      params: GroupParams,
      body: MembersBody,
      response: answers(403, 404)
    }
  }, async (req) => addGroupMembers(db, maxGroupMembers, req.params.group, principalOf(req).address, req.body.members))

  app.post('/group/:group/members/remove', {
    config: { admission: 'heavy' },
    schema: {
      operationId: 'removeGroupMembers',
      tags: ['groups'],
      summary: 'Remove members',
      description: 'The owner may remove anyone but itself (400); a member may remove only itself, leaving the group. ' +
        'Every member, the removed ones included, gets group.members_removed.',
      params: GroupParams,
      body: MembersBody,
      response: answers(403, 404)
    }
  }, async (req) => removeGroupMembers(db, req.params.group, principalOf(req).address, req.body.members))
}
