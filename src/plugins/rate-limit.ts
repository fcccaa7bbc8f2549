import rateLimit from '@fastify/rate-limit'
import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import type { Redis } from 'ioredis'
import { RateLimited } from '../errors.js'
import { answerUnknownRoute } from './errors.js'
import { gcraStore, redisGcraStore } from './rate-limit-stores.js'

/**
 * What an unauthenticated client is counted as: its IPv4 address, or the /64 of its IPv6 one.
 * A single host is routinely given a whole /64, so counting full IPv6 addresses would let it
 * rotate through 2^64 of them to escape the limit. IPv4-mapped IPv6 counts as the IPv4 address.
 */
export function clientNetwork (ip: string): string {
  const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(ip)
  if (mapped !== null) return mapped[1]!
  if (!ip.includes(':')) return ip
  const [head = '', tail = ''] = ip.split('::')
  const left = head === '' ? [] : head.split(':')
  const right = tail === '' ? [] : tail.split(':')
  const groups = ip.includes('::') ? [...left, ...Array<string>(Math.max(0, 8 - left.length - right.length)).fill('0'), ...right] : left
  return `${groups.slice(0, 4).map((g) => (parseInt(g, 16) || 0).toString(16)).join(':')}::/64`
}

export interface RateLimitOptions {
  perSecond: number
  /** Shared counters for several instances; in-process counters without it. */
  redis?: Redis | undefined
  /** The in-process counters' clock (Redis's counters run on Redis's). */
  now?: () => number
}

/**
 * RATE_LIMIT_PER_SECOND requests per second per API key, or per IP for requests whose
 * credentials did not verify. Runs after the auth plugin's onRequest hook (route-level hooks
 * follow instance hooks), so the key is the verified one: registering it without the auth
 * plugin first (its declared dependency) fails at startup rather than counting every request
 * by IP.
 */
export const rateLimitPlugin = fp(async (app: FastifyInstance, opts: RateLimitOptions) => {
  await app.register(rateLimit, {
    max: opts.perSecond,
    timeWindow: 1000,
    // GCRA buckets (rate-limit-stores.ts): in Redis when configured, shared by the instances;
    // while Redis cannot answer, each instance limits on its own rather than not at all.
    store: opts.redis !== undefined
      ? redisGcraStore(opts.redis, 'parley:gcra:', (err) => {
        app.log.warn({ err: { message: err.message } }, 'redis unavailable; rate limits are counted per instance until it is back')
      })
      : gcraStore(opts.now),
    keyGenerator: (req) => req.principal !== null ? `key:${req.principal.keyId}` : `ip:${clientNetwork(req.ip)}`,
    errorResponseBuilder: () => new RateLimited()
  })
  // Unknown paths count too, and answer with the limiter's headers: the plugin limits routes,
  // and the not-found handler is not one unless it asks.
  app.setNotFoundHandler({ preHandler: app.rateLimit() }, answerUnknownRoute)
}, { name: 'parley-rate-limit', dependencies: ['parley-auth'] })
