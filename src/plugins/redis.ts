import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import { Redis } from 'ioredis'

declare module 'fastify' {
  interface FastifyInstance {
    /** Rate-limit counters shared between instances (REDIS_URL); undefined: each counts alone. */
    redis: Redis | undefined
  }
}

export interface RedisOptions {
  url: string | undefined
}

/** The Redis connection, when REDIS_URL gives one; disconnected when the app closes. */
export const redisPlugin = fp(async (app: FastifyInstance, opts: RedisOptions) => {
  if (opts.url === undefined) {
    app.decorate('redis', undefined)
    return
  }
  const redis = new Redis(opts.url, { connectTimeout: 2_000, maxRetriesPerRequest: 1, enableOfflineQueue: false })
  app.decorate('redis', redis)
  redis.on('error', (err) => app.log.warn({ err: { message: err.message } }, 'redis unavailable; rate limits are counted per instance until it is back'))
  app.addHook('onClose', async () => { redis.disconnect() })
  // Serve with shared counters from the first request: wait (briefly) for the connection.
  await new Promise<void>((resolve) => {
    const timer = setTimeout(resolve, 3_000)
    redis.once('ready', () => { clearTimeout(timer); resolve() })
  })
}, { name: 'redis' })
