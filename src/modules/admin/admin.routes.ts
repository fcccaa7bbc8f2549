import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import { decodeTimeCursor, encodeTimeCursor, invalidCursor } from '../../cursors.js'
import type { Db } from '../../db/client.js'
import { NotFound, ValidationFailed } from '../../errors.js'
import { isAddress, normalizeAddress } from '../../ids.js'
import { AUTHENTICATED_ERRORS, errorResponses, NoContent } from '../../schemas.js'
import { audited, requestSource, userChangeActions } from '../audit/audit.service.js'
import type { Authenticator } from '../keys/authenticator.js'
import { createKeysRepository, toKey } from '../keys/keys.repository.js'
import { isKeyId, KeySchema } from '../keys/keys.schemas.js'
import { createUsersRepository, erasedConflict, toAdminUser } from '../users/users.repository.js'
import { AdminUserSchema } from '../users/users.schemas.js'
import { createWebhooksRepository, toAdminWebhook } from '../webhooks/webhooks.repository.js'
import { AdminWebhookList, AdminWebhookParams, AdminWebhooksParams, AdminWebhooksQuery } from '../webhooks/webhooks.schemas.js'
import {
  AdminUserParams, CreatedKeySchema, CreateKeyBody, CreateUserBody, KeyList, KeyParams, ListKeysQuery, ListUsersQuery,
  UpdateKeyBody, UpdateUserBody, UserList
} from './admin.schemas.js'

const ADMIN_ERRORS = [...AUTHENTICATED_ERRORS, 403] as const

function decodeCursor (text: string): string {
  const address = Buffer.from(text, 'base64url').toString('utf8')
  if (!isAddress(address)) throw invalidCursor()
  return address
}

/** A time that is not yet past, for a new expiry. */
function future (text: string | undefined | null, field: string): Date | null | undefined {
  if (text === undefined || text === null) return text
  const at = new Date(text)
  if (Number.isNaN(at.getTime())) throw new ValidationFailed(`${field}: not a date-time`)
  if (at.getTime() <= Date.now()) throw new ValidationFailed(`${field}: must be in the future`)
  return at
}

/**
 * The operator's HTTP API (API.md §9), for keys with the admin scope (the auth plugin checks it):
 * users and keys, live, with no restart and no shell on the database host. A change to a key or
 * user reaches every instance's key cache within its 5 s; this instance forgets at once.
 */
export const adminRoutes: FastifyPluginAsyncTypebox<{ db: Db, authenticator: Authenticator, erasure: { wake(): void } }> = async (app, { db, authenticator, erasure }) => {
  const users = createUsersRepository(db)
  const keys = createKeysRepository(db)
  const webhooks = createWebhooksRepository(db)
  const tags = ['admin']

  app.post('/admin/users', {
    schema: {
      operationId: 'adminCreateUser',
      tags,
      summary: 'Create a user',
      body: CreateUserBody,
      response: { 200: AdminUserSchema, ...errorResponses(...ADMIN_ERRORS, 409) }
    }
  }, async (req) => toAdminUser(await audited(db, requestSource(req), async (tx, record) => {
    const row = await createUsersRepository(tx).create({ address: req.body.address, displayName: req.body.displayName })
    await record('user.create', row.address)
    return row
  })))

  app.get('/admin/users', {
    schema: {
      operationId: 'adminListUsers',
      tags,
      summary: 'List users',
      description: 'By address, cursor-paged; `query` keeps those whose address or display name contains it.',
      querystring: ListUsersQuery,
      response: { 200: UserList, ...errorResponses(...ADMIN_ERRORS) }
    }
  }, async (req) => {
    const limit = req.query.limit ?? 50
    const after = req.query.cursor === undefined ? undefined : decodeCursor(req.query.cursor)
    const rows = await users.page(req.query.query, after, limit + 1)
    const page = rows.slice(0, limit)
    return {
      users: page.map(toAdminUser),
      nextCursor: rows.length > limit ? Buffer.from(page.at(-1)!.address).toString('base64url') : null
    }
  })

  app.get('/admin/users/:user', {
    schema: { operationId: 'adminGetUser', tags, summary: 'Read a user', params: AdminUserParams, response: { 200: AdminUserSchema, ...errorResponses(...ADMIN_ERRORS, 404) } }
  }, async (req) => {
    const row = await users.find(req.params.user)
    if (row === undefined) throw new NotFound('user', normalizeAddress(req.params.user))
    return toAdminUser(row)
  })

  app.post('/admin/users/:user', {
    schema: {
      operationId: 'adminUpdateUser',
      tags,
      summary: 'Rename, deactivate or reactivate a user',
      description: 'A deactivated user\'s keys answer 401 (its event streams close and waiting long-polls answer 401 within ' +
        '5 s), a message to it answers 403 naming it deactivated, group messages skip it, nothing is written to its feed and its ' +
        'webhooks deliver nothing; reactivating restores all of it (webhooks resume where they stopped; what happened while it was ' +
        'deactivated never reaches its feed). A user whose erasure was asked for is neither reactivated nor renamed: 409.',
      params: AdminUserParams,
      body: UpdateUserBody,
      response: { 200: AdminUserSchema, ...errorResponses(...ADMIN_ERRORS, 404, 409) }
    }
  }, async (req) => {
    const row = await audited(db, requestSource(req), async (tx, record) => {
      const row = await createUsersRepository(tx).update(req.params.user, req.body)
      if (row === undefined) throw new NotFound('user', normalizeAddress(req.params.user))
      for (const action of userChangeActions(req.body)) await record(action, row.address)
      return row
    })
    authenticator.clear()
    return toAdminUser(row)
  })

  app.delete('/admin/users/:user', {
    schema: {
      operationId: 'adminEraseUser',
      tags,
      summary: 'Erase a user',
      description: 'API.md §14, for an erasure request (GDPR article 17) or moderation. At once, in the transaction that records ' +
        'the request with a user.erase audit entry: the user is deactivated (its keys answer 401 here at once, everywhere within ' +
        '5 s) and its display name cleared. Then a background job, in short batches that resume after a restart on any instance: ' +
        'every message it sent is deleted for everyone as its own delete would (message.deleted to each recipient), with its ' +
        'attachments, reactions, metadata and search entries; its reactions to others\' messages, its delivery statuses, roster, ' +
        'feed, metadata, webhooks and keys go; its group memberships end, and a group it owns passes to the member that joined ' +
        'longest ago, or is deleted when no one is left. Messages others sent it stay theirs. Meanwhile `erasure` is pending; ' +
        'it is done no sooner than REQUEST_TIMEOUT_SECONDS + 15 s after the request, so that what a request admitted before the ' +
        'deactivation reached every instance leaves is erased too. The user row stays (erasure done, deactivated, no name): ' +
        'the address stays reserved, and the user cannot be reactivated, renamed or given keys (409). Audit entries naming it ' +
        'stay, as the record of what was done. Idempotent: asking again answers 202 with the user as it stands and changes ' +
        'nothing, though each request is recorded in the audit log.',
      params: AdminUserParams,
      response: { 202: AdminUserSchema, ...errorResponses(...ADMIN_ERRORS, 404) }
    }
  }, async (req, reply) => {
    const row = await audited(db, requestSource(req), async (tx, record) => {
      const row = await createUsersRepository(tx).requestErasure(req.params.user)
      if (row === undefined) throw new NotFound('user', normalizeAddress(req.params.user))
      await record('user.erase', row.address)
      return row
    })
    authenticator.clear()
    erasure.wake()
    return reply.code(202).send(toAdminUser(row))
  })

  app.get('/admin/users/:user/webhooks', {
    schema: {
      operationId: 'adminListUserWebhooks',
      tags,
      summary: 'List a user\'s webhooks',
      description: 'Oldest first, cursor-paged; never their secrets. Each names the key that registered it (keyId) and ' +
        'whether it is disabled: revoking that key disables it; while the key is expired or the user deactivated it delivers nothing.',
      params: AdminWebhooksParams,
      querystring: AdminWebhooksQuery,
      response: { 200: AdminWebhookList, ...errorResponses(...ADMIN_ERRORS, 404) }
    }
  }, async (req) => {
    const address = normalizeAddress(req.params.user)
    if (await users.find(address) === undefined) throw new NotFound('user', address)
    const limit = req.query.limit ?? 50
    const rows = await webhooks.page(address, req.query.cursor, limit + 1)
    const page = rows.slice(0, limit)
    return { webhooks: page.map(toAdminWebhook), nextCursor: rows.length > limit ? page.at(-1)!.id : null }
  })

  app.delete('/admin/users/:user/webhooks/:id', {
    schema: {
      operationId: 'adminDeleteUserWebhook',
      tags,
      summary: 'Delete one of a user\'s webhooks',
      description: 'The webhook and its delivery log, at once: nothing more is sent to it (a delivery already in flight ends unrecorded). ' +
        'One at a time, as its owner would: list them first. 404 when the user has no such webhook.',
      params: AdminWebhookParams,
      response: { 204: NoContent, ...errorResponses(...ADMIN_ERRORS, 404) }
    }
  }, async (req, reply) => {
    const address = normalizeAddress(req.params.user)
    if (await users.find(address) === undefined) throw new NotFound('user', address)
    await audited(db, requestSource(req), async (tx, record) => {
      if (!await createWebhooksRepository(tx).remove(address, req.params.id)) throw new NotFound('webhook', req.params.id)
      await record('webhook.delete', req.params.id)
    })
    return reply.code(204).send()
  })

  app.post('/admin/keys', {
    schema: {
      operationId: 'adminCreateKey',
      tags,
      summary: 'Create an API key',
      description: 'For an existing user. The answer is the only time the secret is shown. None for an erased user (409).',
      body: CreateKeyBody,
      response: { 200: CreatedKeySchema, ...errorResponses(...ADMIN_ERRORS, 404, 409) }
    }
  }, async (req) => {
    const address = normalizeAddress(req.body.address)
    const expiresAt = future(req.body.expiresAt, 'expiresAt') ?? null
    const created = await audited(db, requestSource(req), async (tx, record) => {
      // Checked on the user's row locked in the key's own transaction: an erasure asked for
      // meanwhile either waits for this key (and then revokes it with the rest) or is seen here.
      const user = await createUsersRepository(tx).find(address, 'share')
      if (user === undefined) throw new NotFound('user', address)
      if (user.erasureRequestedAt !== null) throw erasedConflict(address, 'it gets no keys')
      const created = await createKeysRepository(tx).create(address, req.body.dailyQuota ?? null, {
        ...(req.body.scopes === undefined ? {} : { scopes: req.body.scopes }),
        expiresAt
      })
      await record('key.create', created.keyId)
      return created
    })
    return { ...toKey(created.key), secret: created.secret }
  })

  app.get('/admin/keys', {
    schema: {
      operationId: 'adminListKeys',
      tags,
      summary: 'List API keys',
      description: 'All keys, or one user\'s, oldest first; never their secrets. Cursor-paged: `limit` (1-200, default 50) ' +
        'keys a page, and `nextCursor` to pass as `cursor` for the next (null on the last). Without a cursor, the first page.',
      querystring: ListKeysQuery,
      response: { 200: KeyList, ...errorResponses(...ADMIN_ERRORS) }
    }
  }, async (req) => {
    const limit = req.query.limit ?? 50
    const after = req.query.cursor === undefined ? undefined : decodeTimeCursor(req.query.cursor, isKeyId)
    const rows = await keys.page(req.query.address, after, limit + 1)
    const page = rows.slice(0, limit)
    const last = page.at(-1)
    return {
      keys: page.map(toKey),
      nextCursor: rows.length > limit && last !== undefined ? encodeTimeCursor({ at: last.createdAt.toISOString(), id: last.id }) : null
    }
  })

  app.post('/admin/keys/:keyId', {
    schema: {
      operationId: 'adminUpdateKey',
      tags,
      summary: 'Change a key\'s scopes, daily quota or expiry',
      params: KeyParams,
      body: UpdateKeyBody,
      response: { 200: KeySchema, ...errorResponses(...ADMIN_ERRORS, 404) }
    }
  }, async (req) => {
    const changes = {
      ...(req.body.scopes === undefined ? {} : { scopes: req.body.scopes }),
      ...(req.body.dailyQuota === undefined ? {} : { dailyQuota: req.body.dailyQuota }),
      ...(req.body.expiresAt === undefined ? {} : { expiresAt: future(req.body.expiresAt, 'expiresAt') ?? null })
    }
    const key = await audited(db, requestSource(req), async (tx, record) => {
      const key = await createKeysRepository(tx).update(req.params.keyId, changes)
      // A body that changes nothing changes nothing to record.
      if (Object.keys(changes).length > 0) await record('key.update', key.id)
      return key
    })
    authenticator.clear()
    return toKey(key)
  })

  app.delete('/admin/keys/:keyId', {
    schema: {
      operationId: 'adminRevokeKey',
      tags,
      summary: 'Revoke a key',
      description: 'Refused everywhere within 5 s (at once on this instance): its event streams are closed, its waiting ' +
        'long-polls answer 401, and the webhooks it registered are disabled, in the same transaction as the revocation.',
      params: KeyParams,
      response: { 204: NoContent, ...errorResponses(...ADMIN_ERRORS, 404) }
    }
  }, async (req, reply) => {
    await audited(db, requestSource(req), async (tx, record) => {
      await createKeysRepository(tx).revoke(req.params.keyId)
      await record('key.revoke', req.params.keyId)
    })
    authenticator.clear()
    return reply.code(204).send()
  })
}
