import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import type { Db } from '../../db/client.js'
import { loggableError } from '../../db/errors.js'
import { createAuthenticator, type Authenticator } from './authenticator.js'

declare module 'fastify' {
  interface FastifyInstance {
    /** Checks API keys (with its cache); the auth plugin takes it, and tests look inside. */
    authenticator: Authenticator
  }
}

export interface AuthenticatorPluginOptions {
  db: Db
  /** DAILY_MESSAGE_QUOTA: a key's quota when it has none of its own. */
  defaultDailyQuota: number
}

/** The process's one authenticator, so its key cache is shared by every route. */
export const authenticatorPlugin = fp(async (app: FastifyInstance, opts: AuthenticatorPluginOptions) => {
  app.decorate('authenticator', createAuthenticator(opts.db, opts.defaultDailyQuota, Date.now,
    (err) => app.log.warn({ err: loggableError(err) }, 'could not record when a key was last used')))
}, { name: 'authenticator' })
