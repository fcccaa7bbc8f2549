import rateLimit from '@fastify/rate-limit'
import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import type { Redis } from 'ioredis'
import { RateLimited } from '../errors.js'

export interface RateLimitOptions {
  perSecond: number
  /** Shared counters for several instances; in-process counters without it. */
  redis?: Redis | undefined
}

/**
 * RATE_LIMIT_PER_SECOND requests per second per API key, or per IP for requests whose
 * credentials did not verify. Runs after the auth plugin's onRequest hook (route-level hooks
 * follow instance hooks), so the key is the verified one.
 */
export const rateLimitPlugin = fp(async (app: FastifyInstance, opts: RateLimitOptions) => {
  await app.register(rateLimit, {
    max: opts.perSecond,
    timeWindow: 1000,
    // Counters in Redis when configured; if Redis is unreachable, serve rather than fail closed.
    ...(opts.redis !== undefined ? { redis: opts.redis, nameSpace: 'parley:rl:', skipOnError: true } : {}),
    keyGenerator: (req) => req.principal !== null ? `key:${req.principal.keyId}` : `ip:${req.ip}`,
    errorResponseBuilder: () => new RateLimited()
  })
}, { name: 'parley-rate-limit' })
