import basicAuth from '@fastify/basic-auth'
import type { FastifyError, FastifyInstance, FastifyRequest } from 'fastify'
import fp from 'fastify-plugin'
import { AuthFailures } from './auth-failures.js'
import { clientNetwork } from './rate-limit.js'
import { isDatabaseUnavailable } from '../db/errors.js'
import { Forbidden, Internal, RateLimited, Unauthorized, Unavailable } from '../errors.js'
import type { Principal } from '../modules/keys/authenticator.js'
import { requiredScope, type Scope } from '../scopes.js'

declare module 'fastify' {
  interface FastifyRequest {
    /** The verified API key, or null on a route that needs none or before authentication. */
    principal: Principal | null
    authError: Error | null
  }
  interface FastifyContextConfig {
    /** The route answers without credentials (the OpenAPI document). */
    public?: boolean
    /** The key scope the route needs, when not the one its method and path imply (scopes.ts). */
    scope?: Scope
  }
}

/** What the plugin asks of the keys module's authenticator (app.authenticator). */
export interface CredentialCheck {
  /** The key's principal when the secret is its own and the key is accepted; undefined otherwise. */
  authenticate (keyId: string, secret: string): Promise<Principal | undefined>
  /** Whether `keyId` is worth a lookup from a network throttled for failed authentications. */
  isKnown (keyId: string): boolean
}

/** The caller of an authenticated route; throws if the route forgot to require auth. */
export function principalOf (req: FastifyRequest): Principal {
  if (req.principal === null) throw new Unauthorized()
  return req.principal
}

/** The key id of a Basic Authorization header, or '' when there is none. */
function basicUsername (header: string | undefined): string {
  const match = /^\s*basic\s+([A-Za-z0-9+/=]+)\s*$/i.exec(header ?? '')
  if (match === null) return ''
  const decoded = Buffer.from(match[1]!, 'base64').toString('latin1')
  const colon = decoded.indexOf(':')
  return colon < 0 ? '' : decoded.slice(0, colon)
}

/**
 * HTTP Basic with key id and secret. Credentials are checked in onRequest, but a failure is
 * only answered in preParsing, after the rate limiter has counted the request against the
 * caller's IP: so a flood of bad credentials is throttled, and a real key's budget is charged
 * only once its secret is proven.
 */
export const authPlugin = fp(async (app: FastifyInstance, opts: { authenticator: CredentialCheck, failuresPerSecond: number, now?: () => number }) => {
  const failures = new AuthFailures(opts.failuresPerSecond, opts.now)
  app.decorateRequest('principal', null)
  app.decorateRequest('authError', null)

  await app.register(basicAuth, {
    authenticate: { realm: 'parley' },
    utf8: false,
    async validate (keyId, secret, req) {
      let principal: Principal | undefined
      try {
        principal = await opts.authenticator.authenticate(keyId, secret)
      } catch (err) {
        // basic-auth would turn any error without a status into a 401; a failing database is not one.
        throw isDatabaseUnavailable(err) ? new Unavailable() : new Internal(err)
      }
      if (principal === undefined) throw new Unauthorized('Invalid API key credentials: unknown or revoked key id, or wrong secret')
      req.principal = principal
    }
  })

  app.addHook('onRequest', (req, reply, done) => {
    if (req.routeOptions.config.public === true) return done()
    const network = clientNetwork(req.ip)
    // A network that keeps failing gets no more lookups this second for ids not already known.
    if (failures.exceeded(network) && !opts.authenticator.isKnown(basicUsername(req.headers.authorization))) {
      return done(new RateLimited())
    }
    app.basicAuth(req, reply, (err?: Error) => {
      if (err !== undefined) {
        // A database failure is not a credentials problem: answer it now (503).
        if ((err as FastifyError).statusCode !== 401) return done(err)
        failures.record(network)
        req.authError = err
      }
      done()
    })
  })

  // Before the body is read: a key without the route's scope costs no parsing.
  app.addHook('preParsing', async (req) => {
    // An unknown path answers 404 to anyone (API.md §1); the rate limiter still counts it.
    if (req.routeOptions.config.public === true || req.is404) return
    if (req.principal === null) {
      throw req.authError instanceof Unauthorized ? req.authError : new Unauthorized()
    }
    const route = req.routeOptions.url
    if (route === undefined) return
    const scope = req.routeOptions.config.scope ?? requiredScope(req.method, route)
    if (!req.principal.scopes.includes(scope)) {
      throw new Forbidden(`This API key lacks the ${scope} scope, which ${req.method} ${route} needs`)
    }
  })
}, { name: 'parley-auth' })
