import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import type { Db } from '../../db/client.js'
import { NotFound } from '../../errors.js'
import { AUTHENTICATED_ERRORS, errorResponses } from '../../schemas.js'
import { createKeysRepository } from '../keys/keys.repository.js'
import { createUsersRepository, toUser } from './users.repository.js'
import { principalOf } from '../../plugins/auth.js'
import { UserParams, UserSchema, WhoamiSchema } from './users.schemas.js'
import { normalizeAddress } from '../../ids.js'

export const usersRoutes: FastifyPluginAsyncTypebox<{ db: Db, messageRetentionDays: number | undefined }> = async (app, { db, messageRetentionDays }) => {
  const users = createUsersRepository(db)
  const keys = createKeysRepository(db)

  app.get('/user/:user', {
    schema: {
      operationId: 'getUser',
      tags: ['users'],
      summary: 'Look a user up by address',
      description: 'Any authenticated key may look any user up.',
      params: UserParams,
      response: { 200: UserSchema, ...errorResponses(...AUTHENTICATED_ERRORS, 404) }
    }
  }, async (req) => {
    const row = await users.find(req.params.user)
    if (row === undefined) throw new NotFound('user', normalizeAddress(req.params.user))
    return toUser(row)
  })

  app.get('/whoami', {
    schema: {
      operationId: 'whoami',
      tags: ['users'],
      summary: 'The user and key behind the credentials',
      description: 'Not in SPEC.md: like Matrix\'s /account/whoami or Slack\'s auth.test, it lets a client that holds only ' +
        'a key id and secret (the web console, for one) learn whose key it is. 401 for bad credentials, as everywhere. ' +
        'retentionDays: how many days the service keeps a message (MESSAGE_RETENTION_DAYS), null while it keeps them until deleted; ' +
        'a group may keep its own for less (GET /group/{id}: effectiveRetentionDays).',
      response: { 200: WhoamiSchema, ...errorResponses(...AUTHENTICATED_ERRORS) }
    }
  }, async (req) => {
    const principal = principalOf(req)
    const [row, key] = await Promise.all([users.find(principal.address), keys.find(principal.keyId)])
    if (row === undefined) throw new NotFound('user', principal.address)
    return {
      user: toUser(row),
      key: {
        id: principal.keyId,
        scopes: principal.scopes,
        dailyQuota: principal.dailyQuota,
        expiresAt: key?.expiresAt?.toISOString() ?? null,
        lastUsedAt: key?.lastUsedAt?.toISOString() ?? null
      },
      keyId: principal.keyId,
      dailyQuota: principal.dailyQuota,
      retentionDays: messageRetentionDays ?? null
    }
  })
}
