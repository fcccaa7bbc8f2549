import type { Writable } from 'node:stream'
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox'
import Fastify, { type FastifyInstance } from 'fastify'
import type { Config } from './config.js'
import type { Database } from './db/client.js'
import { admissionPlugin } from './plugins/admission.js'
import { authPlugin } from './plugins/auth.js'
import { bodyParsersPlugin } from './plugins/body-parsers.js'
import { consolePlugin } from './plugins/console.js'
import { errorsPlugin } from './plugins/errors.js'
import { metricsPlugin } from './plugins/metrics.js'
import { openApiPlugin } from './plugins/openapi.js'
import { rateLimitPlugin } from './plugins/rate-limit.js'
import { readReplicaPlugin } from './plugins/read-replica.js'
import { redisPlugin } from './plugins/redis.js'
import { requestIdPlugin } from './plugins/request-id.js'
import { shutdownPlugin } from './plugins/shutdown.js'
import { adminRoutes } from './modules/admin/admin.routes.js'
import { auditRoutes } from './modules/audit/audit.routes.js'
import { testBotPlugin } from './modules/bot/test-bot.plugin.js'
import { conversationsRoutes } from './modules/conversations/conversations.routes.js'
import { erasureGraceMs } from './modules/erasure/erasure.js'
import { erasurePlugin } from './modules/erasure/erasure.plugin.js'
import type { ErasureBatch } from './modules/erasure/erasure.service.js'
import { eventBusPlugin } from './modules/events/event-bus.plugin.js'
import { eventStreamRoutes } from './modules/events/event-stream.routes.js'
import { eventsRoutes } from './modules/events/events.routes.js'
import { createEventsRepository } from './modules/events/events.repository.js'
import { exportRoutes } from './modules/export/export.routes.js'
import { createFeedReads } from './modules/events/feed-reads.js'
import { createFeedWaiting } from './modules/events/feed-waiting.js'
import { groupsRoutes } from './modules/groups/groups.routes.js'
import { healthRoutes } from './modules/health/health.routes.js'
import { KEY_CACHE_MS } from './modules/keys/authenticator.js'
import { authenticatorPlugin } from './modules/keys/authenticator.plugin.js'
import { messagesRoutes } from './modules/messages/messages.routes.js'
import { reactionFanoutsPlugin } from './modules/messages/reaction-fanouts.plugin.js'
import { sendBatches } from './modules/messages/send-lanes.js'
import { uploadsPlugin } from './modules/messages/uploads.plugin.js'
import { metadataRoutes } from './modules/metadata/metadata.routes.js'
import { retentionPlugin } from './modules/retention/retention.plugin.js'
import { rosterRoutes } from './modules/roster/roster.routes.js'
import { searchRoutes } from './modules/search/search.routes.js'
import { usersRoutes } from './modules/users/users.routes.js'
import { webhookDispatcherPlugin } from './modules/webhooks/webhook-dispatcher.plugin.js'
import { webhooksRoutes } from './modules/webhooks/webhooks.routes.js'
import { serverOptions } from './server-options.js'
import { installKeyring, Keyring } from './sealing/keyring.js'

export interface AppOptions {
  config: Config
  database: Database
  /** Where log lines go (stdout when omitted); tests pass a stream to read them. */
  logStream?: Writable
  /**
   * The clock of the time limits this process keeps on keys and clients: the key cache and a
   * key's expiry, failed authentications' one-second windows, the in-process rate-limit buckets.
   * Date.now when omitted; tests pass one they move, rather than wait for the time to pass.
   */
  now?: () => number
  /**
   * The erasure job's settings where a test sets its own: how long an erasure stays pending at
   * least (erasureGraceMs of REQUEST_TIMEOUT_SECONDS when omitted), how much a batch does, and
   * whether this instance runs the job at all (a test that drives eraseRequested itself).
   */
  erasure?: { graceMs?: number, batch?: ErasureBatch, background?: boolean }
}

/** Builds the service without listening: plugins first, then each resource's routes under /v2. */
export async function buildApp ({ config, database, logStream, now = Date.now, erasure = {} }: AppOptions): Promise<FastifyInstance> {
  // Content is sealed and opened through the process's keyring (src/sealing): the server and the
  // CLI resolve the keys before they build the app (SEALING_KEYS, or the embedded key file). An
  // app built without them (the OpenAPI generator) serves no content: keyring() throws.
  if (config.sealingKeys !== undefined) installKeyring(new Keyring(config.sealingKeys))
  const app = Fastify(serverOptions(config, logStream)).withTypeProvider<TypeBoxTypeProvider>()

  await app.register(requestIdPlugin)
  await app.register(metricsPlugin, { database })
  await app.register(authenticatorPlugin, { db: database.db, defaultDailyQuota: config.dailyMessageQuota, now })
  await app.register(redisPlugin, { url: config.redisUrl })
  await app.register(readReplicaPlugin, {
    primary: database.db, url: config.databaseReadUrl, poolSize: config.databasePoolSize, maxWaitMs: config.databaseReadMaxWaitMs
  })
  // Background work. preClose hooks run in the order they are added: the closing flag, then the
  // retention and erasure timers, the event bus (waiting long-polls answer now), the bot and webhooks.
  await app.register(shutdownPlugin)
  await app.register(retentionPlugin, { db: database.db, auditRetentionDays: config.auditRetentionDays, messageRetentionDays: config.messageRetentionDays })
  await app.register(erasurePlugin, {
    db: database.db, graceMs: erasure.graceMs ?? erasureGraceMs(KEY_CACHE_MS, config.requestTimeoutSeconds), batch: erasure.batch, background: erasure.background
  })
  await app.register(reactionFanoutsPlugin, { db: database.db })
  await app.register(eventBusPlugin, { database, now })
  // Waits on feeds (long-polls, event streams, the bot); long-polls and event streams count
  // against one per-key cap.
  const feed = createFeedWaiting({ bus: app.eventBus, keyWatch: app.keyWatch, maxPerKey: config.maxLongPollsPerKey })
  await app.register(testBotPlugin, { db: database.db, address: config.testBotAddress, feed })
  await app.register(webhookDispatcherPlugin, {
    db: database.db, secretsKey: config.webhookSecretsKey, allowPrivate: config.webhookAllowPrivate
  })

  await app.register(openApiPlugin)
  await app.register(errorsPlugin, {
    maxAttachments: config.maxAttachments,
    maxAttachmentBytes: config.maxAttachmentBytes,
    onError: (code) => app.metrics.error(code)
  })
  await app.register(bodyParsersPlugin, {
    // The largest lists a schema takes are 1,000 members or event ids; metadata is 16 KiB.
    maxBodyValues: 20_000
  })
  // multipart/form-data, for the routes that take files: beside the attachment store it fills.
  // At the root, with the body parsers, and after them (its hooks run after theirs).
  await app.register(uploadsPlugin, {
    db: database.db,
    maxAttachments: config.maxAttachments,
    maxAttachmentBytes: config.maxAttachmentBytes,
    maxBodyChars: config.maxBodyChars
  })
  await app.register(healthRoutes, { database, metrics: app.metrics, serveMetrics: config.metricsPort === undefined })
  // Encapsulated: helmet's headers and CSP apply to the console's files only.
  await app.register(consolePlugin)

  await app.register(async (v2) => {
    await v2.register(authPlugin, { authenticator: app.authenticator, failuresPerSecond: config.rateLimitPerSecond, now })
    await v2.register(rateLimitPlugin, { perSecond: config.rateLimitPerSecond, redis: app.redis, now })
    // PGlite is one connection: its requests take turns however many keys there are. Asked of
    // the database itself, not of DATABASE_URL: tests hand the app a database they opened.
    const poolSize = database.driver === 'pglite' ? 1 : config.databasePoolSize
    await v2.register(admissionPlugin, { poolSize, metrics: app.metrics })
    v2.get('/openapi.json', {
      config: { public: true },
      schema: { hide: true }
    }, async () => app.swagger())
    await v2.register(usersRoutes, { db: database.db, messageRetentionDays: config.messageRetentionDays })
    await v2.register(messagesRoutes, {
      db: database.db, maxBodyChars: config.maxBodyChars, editWindowSeconds: config.messageEditWindowSeconds, metrics: app.metrics, sendBatches: sendBatches(poolSize), now
    })
    // A wake-up's feed reads, gathered into statements: a quarter of the pool at most (the
    // rest for sends and other reads), and at most 4 (an answer may hold 32 pages of 256 KiB).
    // The embedded database's one connection runs one statement at a time for every key:
    // shorter ones there, so another key's statement waits behind less.
    const events = createEventsRepository(database.db)
    const feedReads = createFeedReads((reads) => events.pages(reads), database.driver === 'pglite'
      ? { perStatement: 8, inFlight: 1 }
      : { perStatement: 32, inFlight: Math.min(4, Math.max(1, Math.floor(poolSize / 4))) })
    await v2.register(eventsRoutes, { db: database.db, reads: app.reads, metrics: app.metrics, feed, feedReads })
    await v2.register(eventStreamRoutes, { feed, feedReads, heartbeatMs: config.eventStreamHeartbeatSeconds * 1000 })
    await v2.register(groupsRoutes, { db: database.db, maxGroupMembers: config.maxGroupMembers, messageRetentionDays: config.messageRetentionDays })
    await v2.register(rosterRoutes, { db: database.db })
    await v2.register(metadataRoutes, { db: database.db })
    await v2.register(searchRoutes, { reads: app.reads, messageRetentionDays: config.messageRetentionDays })
    await v2.register(conversationsRoutes, { db: database.db, reads: app.reads })
    await v2.register(adminRoutes, { db: database.db, authenticator: app.authenticator, erasure: app.erasure })
    await v2.register(auditRoutes, { db: database.db })
    // Each export on PostgreSQL holds a connection for its whole download: a quarter of the pool.
    await v2.register(exportRoutes, { database, maxExports: database.driver === 'pglite' ? 2 : Math.max(1, Math.floor(poolSize / 4)), maxSeconds: config.exportMaxSeconds })
    await v2.register(webhooksRoutes, { db: database.db, dispatcher: app.webhookDispatcher, secrets: app.webhookSecrets, allowPrivate: config.webhookAllowPrivate })
  }, { prefix: '/v2' })

  return app
}
