import rateLimit, { type FastifyRateLimitStore } from '@fastify/rate-limit'
import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import type { Redis } from 'ioredis'
import { RateLimited } from '../errors.js'

type StoreCallback = (err: Error | null, result?: { current: number, ttl: number }) => void

/**
 * In-process fixed windows. The plugin's own LocalStore hands every request the same mutable
 * counter object and reads it after an await, so a burst of N concurrent requests all see
 * count N and all but none are refused; this store answers each request with its own snapshot.
 */
export class FixedWindowStore implements FastifyRateLimitStore {
  private readonly windows = new Map<string, { count: number, startedAt: number }>()

  incr (key: string, cb: StoreCallback, timeWindow: number): void {
    const now = Date.now()
    let window = this.windows.get(key)
    if (window === undefined || window.startedAt + timeWindow <= now) {
      if (this.windows.size >= 100_000) this.sweep(now, timeWindow)
      window = { count: 0, startedAt: now }
      this.windows.set(key, window)
    }
    window.count += 1
    cb(null, { current: window.count, ttl: window.startedAt + timeWindow - now })
  }

  read (key: string, cb: StoreCallback, timeWindow: number): void {
    const now = Date.now()
    const window = this.windows.get(key)
    if (window === undefined || window.startedAt + timeWindow <= now) cb(null, { current: 0, ttl: 0 })
    else cb(null, { current: window.count, ttl: window.startedAt + timeWindow - now })
  }

  child (): FixedWindowStore {
    return new FixedWindowStore()
  }

  private sweep (now: number, timeWindow: number): void {
    for (const [key, window] of this.windows) {
      if (window.startedAt + timeWindow <= now) this.windows.delete(key)
    }
  }
}

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
    ...(opts.redis !== undefined
      ? { redis: opts.redis, nameSpace: 'parley:rl:', skipOnError: true }
      : { store: FixedWindowStore }),
    keyGenerator: (req) => req.principal !== null ? `key:${req.principal.keyId}` : `ip:${clientNetwork(req.ip)}`,
    errorResponseBuilder: () => new RateLimited()
  })
}, { name: 'parley-rate-limit' })
