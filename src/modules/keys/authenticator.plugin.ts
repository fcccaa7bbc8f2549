import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import type { Db } from '../../db/client.js'
import { loggableError } from '../../db/errors.js'
import { createAuthenticator, type Authenticator } from './authenticator.js'
import { createKeyWatch, KEY_WATCH_MS, type KeyWatch } from './key-watch.js'

declare module 'fastify' {
  interface FastifyInstance {
    /** Checks API keys (with its cache); the auth plugin takes it, and tests look inside. */
    authenticator: Authenticator
    /** Looks again at the keys of requests that stay open (event streams, long-polls). */
    keyWatch: KeyWatch
  }
}

export interface AuthenticatorPluginOptions {
  db: Db
  /** DAILY_MESSAGE_QUOTA: a key's quota when it has none of its own. */
  defaultDailyQuota: number
  /** The key cache's clock (and expiry's): Date.now unless given. */
  now?: () => number
}

/** The process's one authenticator, so its key cache is shared by every route. */
export const authenticatorPlugin = fp(async (app: FastifyInstance, opts: AuthenticatorPluginOptions) => {
  app.decorate('authenticator', createAuthenticator(opts.db, opts.defaultDailyQuota, opts.now,
    (err) => app.log.warn({ err: loggableError(err) }, 'could not record when a key was last used')))
  const watch = createKeyWatch(opts.db, KEY_WATCH_MS,
    (err) => app.log.warn({ err: loggableError(err) }, 'could not check the keys of open event streams; will retry'))
  app.decorate('keyWatch', watch)
  app.addHook('onClose', async () => { watch.stop() })
}, { name: 'authenticator' })
