import type { FastifyRateLimitStore } from '@fastify/rate-limit'
import type { Redis } from 'ioredis'

type StoreCallback = (err: Error | null, result?: { current: number, ttl: number }) => void

/**
 * The generic cell rate algorithm (GCRA), the token bucket written as one timestamp per key:
 * `max` requests per `period` ms, refilled continuously (one every period/max ms), with a
 * burst of up to `max`. Unlike fixed windows, a client that keeps to the rate on average is
 * not refused because its requests reached the server bunched together (a slow answer
 * delays a client's next requests, which then arrive at once) or straddled a window's start.
 * Answers what @fastify/rate-limit expects: `current`, the places in use (max + 1 when
 * refused), and `ttl`, ms until the bucket is full again (when refused: until one place frees).
 */
export function gcra (tat: number | undefined, now: number, period: number, max: number): { tat: number | undefined, current: number, ttl: number } {
  const interval = period / max
  const start = Math.max(tat ?? now, now)
  const next = start + interval
  if (next - now > period) return { tat, current: max + 1, ttl: Math.ceil(next - period - now) }
  return { tat: next, current: Math.ceil((next - now) / interval - 1e-9), ttl: Math.ceil(next - now) }
}

/** In-process GCRA on `now`'s clock: one timestamp per key, each request answered with its own snapshot. */
class GcraBuckets implements FastifyRateLimitStore {
  private readonly tats = new Map<string, number>()

  private readonly now: () => number

  constructor (now: () => number) {
    this.now = now
  }

  incr (key: string, cb: StoreCallback, period: number, max: number): void {
    const now = this.now()
    if (this.tats.size >= 100_000) this.sweep(now)
    const result = gcra(this.tats.get(key), now, period, max)
    if (result.tat !== undefined) this.tats.set(key, result.tat)
    cb(null, { current: result.current, ttl: result.ttl })
  }

  child (): GcraBuckets {
    return new GcraBuckets(this.now)
  }

  private sweep (now: number): void {
    for (const [key, tat] of this.tats) if (tat <= now) this.tats.delete(key)
  }
}

/**
 * In-process GCRA buckets, as @fastify/rate-limit takes a store (a class it constructs), on
 * `now`'s clock (Date.now; a test's own that it moves).
 */
export function gcraStore (now: () => number = Date.now): new () => FastifyRateLimitStore {
  return class GcraStore extends GcraBuckets {
    constructor () {
      super(now)
    }
  }
}

// The same algorithm in Redis, on Redis's clock, so every instance shares one bucket per key.
const GCRA_LUA = `
local period = tonumber(ARGV[1])
local max = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local interval = period / max
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then tat = now end
local nextTat = tat + interval
if nextTat - now > period then
  return {max + 1, math.ceil(nextTat - period - now)}
end
redis.call('SET', KEYS[1], string.format('%.3f', nextTat), 'PX', math.ceil(nextTat - now))
return {math.ceil((nextTat - now) / interval - 1e-9), math.ceil(nextTat - now)}
`

interface GcraRedis extends Redis {
  parleyGcra(key: string, period: number, max: number): Promise<[number, number]>
}

/**
 * GCRA buckets in Redis, shared by every instance. When Redis cannot answer, the instance
 * limits on its own (in-process buckets) rather than not at all, and says so in the log once per outage.
 */
export function redisGcraStore (redis: Redis, prefix: string, onFallback: (err: Error) => void): new () => FastifyRateLimitStore {
  if (!('parleyGcra' in redis)) redis.defineCommand('parleyGcra', { numberOfKeys: 1, lua: GCRA_LUA })
  const shared = redis as GcraRedis
  const local = new GcraBuckets(Date.now)
  let failing = false
  return class RedisGcraStore implements FastifyRateLimitStore {
    incr (key: string, cb: StoreCallback, period: number, max: number): void {
      shared.parleyGcra(prefix + key, period, max).then(([current, ttl]) => {
        failing = false
        cb(null, { current, ttl })
      }, (err: Error) => {
        if (!failing) onFallback(err)
        failing = true
        local.incr(key, cb, period, max)
      })
    }

    child (): FastifyRateLimitStore {
      return new RedisGcraStore()
    }
  }
}
