import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import type { Database } from '../db/client.js'
import { createMetrics, type Metrics } from '../metrics.js'

declare module 'fastify' {
  interface FastifyInstance {
    /** The process's metrics: GET /metrics renders them, and so does METRICS_PORT's listener. */
    metrics: Metrics
  }
}

export interface MetricsOptions {
  database: Database
}

/** Makes the metrics, times every request, and reports the database's connections. */
export const metricsPlugin = fp(async (app: FastifyInstance, opts: MetricsOptions) => {
  const metrics = createMetrics()
  app.decorate('metrics', metrics)
  // Unmatched paths share one label, so scanners cannot blow up the series count.
  app.addHook('onResponse', async (req, reply) => {
    metrics.observeRequest(req.method, req.routeOptions.url ?? 'unmatched', reply.statusCode, reply.elapsedTime / 1000)
  })
  metrics.gauge('parley_db_connections', 'Database connections by state (PGlite: one)', () => {
    const stats = opts.database.stats()
    return [
      { labels: { state: 'total' }, value: stats.total },
      { labels: { state: 'idle' }, value: stats.idle },
      { labels: { state: 'waiting' }, value: stats.waiting }
    ]
  })
  metrics.gauge('parley_db_named_statements',
    '1 while the hottest statements run as named prepared statements; 0 behind a transaction pooler (DATABASE_POOLER), or once one was found lost through a pooler nobody declared',
    () => [{ value: opts.database.namedStatements ? 1 : 0 }])
}, { name: 'metrics' })
