import { performance } from 'node:perf_hooks'
import type { FastifyInstance, FastifyReply } from 'fastify'
import fp from 'fastify-plugin'
import type { Db } from '../db/client.js'
import { sqlState } from '../db/errors.js'
import { openReplica, primaryReads, type ReadOutcome, type Reads, type ReplicaState } from '../db/replica.js'

declare module 'fastify' {
  interface FastifyInstance {
    /** Reads that may be served by the replica (DATABASE_READ_URL); all on the primary without one. */
    reads: Reads
  }
}

/**
 * What of a replica failure goes into the log: a SQLSTATE alone when the server answered (its
 * message may quote a value of the read), else the driver's message (a refused or lost
 * connection), never a query error's own message, which carries the read's parameters.
 */
function driverCause (err: Error): { code: string } | { message: string } {
  const driver = err.cause instanceof Error ? err.cause : err
  const code = sqlState(driver)
  return code === undefined ? { message: driver.message } : { code }
}
export interface ReadReplicaOptions {
  primary: Db
  url: string | undefined
  poolSize: number
  maxWaitMs: number
}

/**
 * When the request arrived, on performance.now()'s clock (Fastify starts timing a request as
 * it routes it, after its client sent it): a WAL position sampled after this covers every
 * write the client was answered before.
 */
export function arrivalOf (reply: FastifyReply): number {
  return performance.now() - reply.elapsedTime
}

const STATE_TEXT: Record<ReplicaState, string> = {
  up: 'the read replica is up: reads that may lag are served there',
  behind: 'the read replica is behind the primary; reads go to the primary until it catches up',
  down: 'the read replica is unavailable; reads go to the primary until it is back',
  not_standby: 'DATABASE_READ_URL is not a standby of DATABASE_URL (not in recovery, or another cluster); reads go to the primary'
}

/** The replica's pool, its metrics, and its state changes in the log; closed with the app. */
export const readReplicaPlugin = fp(async (app: FastifyInstance, opts: ReadReplicaOptions) => {
  if (opts.url === undefined) {
    app.decorate('reads', primaryReads(opts.primary))
    return
  }
  const count = app.metrics.counter('parley_replica_reads_total',
    'Reads that may be served by the replica (DATABASE_READ_URL), by where they ran and why')
  const onRead = (reason: ReadOutcome) => count({ served: reason === 'caught_up' ? 'replica' : 'primary', reason })
  const replica = await openReplica({
    primary: opts.primary,
    url: opts.url,
    poolSize: opts.poolSize,
    maxWaitMs: opts.maxWaitMs,
    onRead,
    // The driver's message and code only: an error object may carry the connection string's
    // parts, and a query error's message the read's parameters (a viewer, search words).
    onStateChange: (state, _previous, cause) => {
      const detail = cause instanceof Error ? { cause: driverCause(cause) } : {}
      // Falling behind for a moment is routine under a burst of writes; going away is not.
      if (state === 'up' || state === 'behind') app.log.info(detail, STATE_TEXT[state])
      else app.log.warn(detail, STATE_TEXT[state])
    }
  })
  if (replica.status().state === 'down') app.log.warn(STATE_TEXT.down)
  app.decorate('reads', replica)
  app.addHook('onClose', async () => { await replica.close() })

  app.metrics.gauge('parley_replica_up', 'Whether reads that may lag are served by the replica now (1) or by the primary (0)',
    () => [{ value: replica.status().state === 'up' ? 1 : 0 }])
  app.metrics.gauge('parley_replica_lag_bytes', 'WAL the replica had yet to replay at the last look (a read or a probe every 5 s)', () => {
    const { lagBytes } = replica.status()
    return lagBytes === undefined ? [] : [{ value: lagBytes }]
  })
  app.metrics.gauge('parley_replica_lag_seconds', 'Age of the last transaction the replica replayed while it had WAL left to replay (0 when caught up), at the last probe', () => {
    const { lagSeconds } = replica.status()
    return lagSeconds === undefined ? [] : [{ value: lagSeconds }]
  })
}, { name: 'read-replica', dependencies: ['metrics'] })
