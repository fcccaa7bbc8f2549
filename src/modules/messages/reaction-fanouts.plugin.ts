import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import type { Db } from '../../db/client.js'
import { loggableError } from '../../db/errors.js'
import { tellLeftFanouts } from './reactions.service.js'

/** How old a queued fan-out is before a sweep takes it as left: a request tells its own within moments. */
const LEFT_AFTER_MS = 30_000
const EVERY_MS = 60_000
/** The first look after start: a restarted instance tells what the stopped one left. */
const FIRST_MS = 5_000

/**
 * The sweep of reaction fan-outs a stopped process left half told (reaction_fanouts): a minute
 * after the last ended, on every instance (a message's tellers take turns on a lock of their own),
 * the first 5 s after the app is ready; a fan-out is taken once 30 s old, so what a request
 * left (its process stopped, or telling failed) is told 30-90 s later by a running instance, or
 * within about 90 s of the next start, 100 messages a look. Stopped at shutdown after the
 * transaction under way.
 */
export const reactionFanoutsPlugin = fp(async (app: FastifyInstance, opts: { db: Db }) => {
  let timer: NodeJS.Timeout | undefined
  let running: Promise<void> | undefined
  const stopping = new AbortController()
  const sweep = () => {
    running = tellLeftFanouts(opts.db, app.log, LEFT_AFTER_MS, stopping.signal).then(
      (n) => { if (n > 0) app.log.info({ messages: n }, 'told the reaction fan-outs their requests left') },
      (err: unknown) => { app.log.error({ err: loggableError(err) }, 'looking for left reaction fan-outs failed; the next sweep tries again') }
    ).finally(() => {
      running = undefined
      if (!stopping.signal.aborted) timer = setTimeout(sweep, EVERY_MS).unref()
    })
  }
  app.addHook('onReady', async () => { timer = setTimeout(sweep, FIRST_MS).unref() })
  app.addHook('preClose', async () => {
    stopping.abort()
    clearTimeout(timer)
    await running
  })
}, { name: 'reaction-fanouts' })
