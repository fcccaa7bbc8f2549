import { randomBytes } from 'node:crypto'
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import type { Db } from '../../db/client.js'
import { AppError, Conflict, NotFound } from '../../errors.js'
import { newId } from '../../ids.js'
import { principalOf } from '../../plugins/auth.js'
import { audited, requestSource } from '../audit/audit.service.js'
import { AUTHENTICATED_ERRORS, errorResponses, NoContent } from '../../schemas.js'
import type { WebhookDispatcher } from './webhook-dispatcher.js'
import type { SecretBox } from './webhook-secrets.js'
import { checkWebhookTarget, parseWebhookUrl } from './webhook-target.js'
import { createWebhooksRepository, toWebhook, toWebhookDelivery } from './webhooks.repository.js'
import {
  CreatedWebhookSchema, CreateWebhookBody, DeliveriesQuery, DeliveryListSchema, RedeliverBody, WebhookListSchema, WebhookParams
} from './webhooks.schemas.js'
import type { WebhookRow } from './webhooks.table.js'

/** Webhooks one user may have: each event of the feed is sent once to each. */
const MAX_WEBHOOKS_PER_USER = 10

const tooMany = (address: string) => new Conflict(`${address} already has ${MAX_WEBHOOKS_PER_USER} webhooks, the most a user may have; delete one first`)

export interface WebhooksRoutesOptions {
  db: Db
  dispatcher: WebhookDispatcher
  secrets: SecretBox
  allowPrivate: boolean
}

export const webhooksRoutes: FastifyPluginAsyncTypebox<WebhooksRoutesOptions> = async (app, { db, dispatcher, secrets, allowPrivate }) => {
  const webhooks = createWebhooksRepository(db)
  let warned = false

  async function owned (address: string, id: string): Promise<WebhookRow> {
    const webhook = await webhooks.get(address, id)
    if (webhook === undefined) throw new NotFound('webhook', id)
    return webhook
  }

  app.post('/webhooks', {
    schema: {
      operationId: 'createWebhook',
      tags: ['webhooks'],
      summary: 'Register a webhook',
      description: 'Each event of the caller\'s feed (of the listed types) is POSTed to the URL, signed with the secret returned ' +
        'here once (X-Parley-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">). In id order, at least once; ' +
        `retried with backoff for 24 h, then disabled. At most ${MAX_WEBHOOKS_PER_USER} per user. It belongs to the key that ` +
        'registered it: revoking that key disables it; while the key is expired (or lacks the read scope) or the user is ' +
        'deactivated, nothing is delivered, and delivery resumes where it stopped once they are accepted again.',
      body: CreateWebhookBody,
      response: { 200: CreatedWebhookSchema, ...errorResponses(...AUTHENTICATED_ERRORS, 409) }
    }
  }, async (req) => {
    const { address: me, keyId } = principalOf(req)
    if (!secrets.sealing && !allowPrivate) {
      throw new AppError(503, 'UNAVAILABLE', 'Webhooks are not enabled on this server: its operator must set WEBHOOK_SECRETS_KEY, which keeps their signing secrets sealed')
    }
    const url = parseWebhookUrl(req.body.url, allowPrivate)
    // The cap before the DNS lookup: a user at the cap costs no resolution.
    if ((await webhooks.list(me)).length >= MAX_WEBHOOKS_PER_USER) throw tooMany(me)
    await checkWebhookTarget(url, allowPrivate)
    const id = newId('whk')
    const secret = `whsec_${randomBytes(32).toString('base64url')}`
    if (!secrets.sealing && !warned) {
      warned = true
      req.log.warn('webhook signing secrets are stored unsealed (WEBHOOK_ALLOW_PRIVATE=true, development): set WEBHOOK_SECRETS_KEY to seal them')
    }
    const sealed = secrets.seal(id, secret)
    const created = await audited(db, requestSource(req), async (tx, record) => {
      const created = await createWebhooksRepository(tx).create({ id, address: me, keyId, url: url.href, events: req.body.events ?? null, secret: sealed }, MAX_WEBHOOKS_PER_USER)
      if (created === undefined) throw tooMany(me)
      await record('webhook.create', created.id)
      return created
    })
    dispatcher.watch(me)
    return { ...toWebhook(created), secret }
  })

  app.get('/webhooks', {
    schema: {
      operationId: 'listWebhooks',
      tags: ['webhooks'],
      summary: 'The caller\'s webhooks (never their secrets)',
      response: { 200: WebhookListSchema, ...errorResponses(...AUTHENTICATED_ERRORS) }
    }
  }, async (req) => ({ webhooks: (await webhooks.list(principalOf(req).address)).map(toWebhook) }))

  app.delete('/webhooks/:id', {
    schema: {
      operationId: 'deleteWebhook',
      tags: ['webhooks'],
      summary: 'Delete a webhook and its delivery log',
      params: WebhookParams,
      response: { 204: NoContent, ...errorResponses(...AUTHENTICATED_ERRORS, 404) }
    }
  }, async (req, reply) => {
    await audited(db, requestSource(req), async (tx, record) => {
      if (!await createWebhooksRepository(tx).remove(principalOf(req).address, req.params.id)) throw new NotFound('webhook', req.params.id)
      await record('webhook.delete', req.params.id)
    })
    return reply.code(204).send()
  })

  app.get('/webhooks/:id/deliveries', {
    schema: {
      operationId: 'listWebhookDeliveries',
      tags: ['webhooks'],
      summary: 'A webhook\'s delivery log, newest event first',
      description: 'pending: not delivered yet, retried with backoff; delivered: a 2xx answer came; failed: given up (the webhook was disabled).',
      params: WebhookParams,
      querystring: DeliveriesQuery,
      response: { 200: DeliveryListSchema, ...errorResponses(...AUTHENTICATED_ERRORS, 404) }
    }
  }, async (req) => {
    const webhook = await owned(principalOf(req).address, req.params.id)
    const limit = req.query.limit ?? 50
    const rows = await webhooks.deliveries(webhook.id, limit + 1, req.query.cursor === undefined ? undefined : Number(req.query.cursor))
    const page = rows.slice(0, limit)
    return { deliveries: page.map(toWebhookDelivery), nextCursor: rows.length > limit ? String(page.at(-1)!.eventId) : null }
  })

  app.post('/webhooks/:id/redeliver', {
    schema: {
      operationId: 'redeliverWebhookEvent',
      tags: ['webhooks'],
      summary: 'Send one event to a webhook again',
      description: 'Sent before the feed\'s next event, whatever its earlier outcome.',
      params: WebhookParams,
      body: RedeliverBody,
      response: { 204: NoContent, ...errorResponses(...AUTHENTICATED_ERRORS, 404, 409) }
    }
  }, async (req, reply) => {
    const webhook = await owned(principalOf(req).address, req.params.id)
    if (webhook.disabledAt !== null) throw new Conflict(`webhook ${webhook.id} is disabled (its deliveries kept failing, or the key that registered it was revoked); delete it and register it again`)
    if (!await webhooks.markRedelivery(webhook, Number(req.body.event))) throw new NotFound('event', req.body.event)
    dispatcher.watch(webhook.address)
    return reply.code(204).send()
  })
}
