import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import type { Database } from '../../db/client.js'
import { loggableError } from '../../db/errors.js'
import { createEventBus, type EventBus } from './event-bus.js'
import { announceToOwnListeners, onAnnounceError } from './announcements.repository.js'

declare module 'fastify' {
  interface FastifyInstance {
    /** Wakes long-polls, streams, the test bot and webhook delivery when a feed grows. */
    eventBus: EventBus
  }
}

export interface EventBusPluginOptions {
  database: Database
  /** The app's clock, in ms: how long a look that found the process alone on its database is trusted (announcements.repository.ts). */
  now?: () => number
}

/**
 * One LISTEN connection for the process, listening before the app is ready; what this process
 * announces (announcements.repository.ts) and fails to is logged here. Stopped before
 * connections drain: waiting long-polls answer (empty) at once instead of holding shutdown.
 * After the shutdown plugin (a declared dependency), whose preClose hook must run first: the
 * answers the stop wakes then carry `Connection: close`.
 */
export const eventBusPlugin = fp(async (app: FastifyInstance, opts: EventBusPluginOptions) => {
  const bus = createEventBus(opts.database)
  await bus.start()
  const announced = app.metrics.counter('parley_announcements_total',
    'Announcements of grown feeds this instance made: a NOTIFY (via="notify"), or handed to its own listeners while no other session could hear one (via="own")')
  const stopAnnouncingToOwn = announceToOwnListeners(opts.database, (via) => announced({ via }), opts.now)
  onAnnounceError(opts.database.db, (err, feeds) => {
    // Shutting down, the database may close before a last announcement: nobody waits by then.
    if (!bus.closing) app.log.warn({ err: loggableError(err), feeds }, 'telling listeners of grown feeds failed: their waiters read them again within 30 s')
  })
  app.decorate('eventBus', bus)
  app.addHook('preClose', async () => {
    stopAnnouncingToOwn()
    await bus.stop()
  })
}, { name: 'event-bus', dependencies: ['shutdown', 'metrics'] })
