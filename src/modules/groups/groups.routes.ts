import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import type { Db } from '../../db/client.js'
import { principalOf } from '../../plugins/auth.js'
import { AUTHENTICATED_ERRORS, errorResponses, NoContent } from '../../schemas.js'
import { CreateGroupBody, GroupParams, GroupSchema, MembersBody, UpdateGroupBody, type Group, type StoredGroup } from './groups.schemas.js'
import { addGroupMembers, createGroup, deleteGroup, readGroup, removeGroupMembers, updateGroup, withRetention } from './groups.service.js'

interface GroupsRoutesOptions {
  db: Db
  maxGroupMembers: number
  /** MESSAGE_RETENTION_DAYS: a group's effectiveRetentionDays is the shorter of it and the group's own. */
  messageRetentionDays: number | undefined
}

export const groupsRoutes: FastifyPluginAsyncTypebox<GroupsRoutesOptions> = async (app, { db, maxGroupMembers, messageRetentionDays }) => {
  const answers = (...statuses: number[]) => ({ 200: GroupSchema, ...errorResponses(...AUTHENTICATED_ERRORS, ...statuses) })
  const answer = async (group: Promise<StoredGroup>): Promise<Group> => withRetention(await group, messageRetentionDays)

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
  }, async (req) => answer(createGroup(db, maxGroupMembers, principalOf(req).address, req.body.name, req.body.members ?? [])))

  app.get('/group/:group', {
    schema: {
      operationId: 'getGroup',
      tags: ['groups'],
      summary: 'Read a group',
      description: 'Members only. retentionDays is the group\'s own retention; effectiveRetentionDays what applies to its messages: ' +
        'the shorter of that and MESSAGE_RETENTION_DAYS.',
      params: GroupParams,
      response: answers(403, 404)
    }
  }, async (req) => answer(readGroup(db, req.params.group, principalOf(req).address)))

  app.post('/group/:group', {
    config: { admission: 'heavy' },
    schema: {
      operationId: 'updateGroup',
      tags: ['groups'],
      summary: 'Rename a group, or set how long its messages are kept',
      description: 'Owner only. name renames it; retentionDays (1-36500, null to clear) purges its messages once older than that ' +
        'many days, when shorter than the service\'s MESSAGE_RETENTION_DAYS (the shorter of the two applies: effectiveRetentionDays). ' +
        'At least one of the two. Every member gets group.updated.',
      params: GroupParams,
      body: UpdateGroupBody,
      response: answers(403, 404)
    }
  }, async (req) => answer(updateGroup(db, req.params.group, principalOf(req).address, req.body)))

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
  }, async (req) => answer(addGroupMembers(db, maxGroupMembers, req.params.group, principalOf(req).address, req.body.members)))

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
  }, async (req) => answer(removeGroupMembers(db, req.params.group, principalOf(req).address, req.body.members)))
}
