import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import type { Db } from '../../db/client.js'
import { createWebhookDispatcher, type WebhookDispatcher } from './webhook-dispatcher.js'
import { createSecretBox, type SecretBox } from './webhook-secrets.js'
import { createWebhookSender } from './webhook-sender.js'

declare module 'fastify' {
  interface FastifyInstance {
    /** Delivers feeds to webhooks; the routes tell it of webhooks made or removed. */
    webhookDispatcher: WebhookDispatcher
    /** Seals webhook signing secrets at rest (WEBHOOK_SECRETS_KEY), for the routes too. */
    webhookSecrets: SecretBox
  }
}

export interface WebhookDispatcherPluginOptions {
  db: Db
  /** WEBHOOK_SECRETS_KEY; undefined stores signing secrets unsealed. */
  secretsKey: Buffer | undefined
  /** WEBHOOK_ALLOW_PRIVATE: webhooks may target private and loopback addresses, and plain http://. */
  allowPrivate: boolean
}

/**
 * Webhook delivery, woken by the event bus: claims work once the app is ready; at shutdown
 * it cuts off deliveries in flight and waits for their batches to record.
 */
export const webhookDispatcherPlugin = fp(async (app: FastifyInstance, opts: WebhookDispatcherPluginOptions) => {
  const secrets = createSecretBox(opts.secretsKey)
  const dispatcher = createWebhookDispatcher({
    db: opts.db, bus: app.eventBus, sender: createWebhookSender(opts.allowPrivate), secrets, log: app.log, metrics: app.metrics
  })
  app.decorate('webhookSecrets', secrets)
  app.decorate('webhookDispatcher', dispatcher)
  app.addHook('onReady', async () => { dispatcher.start() })
  app.addHook('preClose', async () => { await dispatcher.stop() })
}, { name: 'webhook-dispatcher', dependencies: ['event-bus', 'metrics'] })
