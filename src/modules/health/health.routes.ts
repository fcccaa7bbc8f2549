import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import { Type } from 'typebox'
import type { Database } from '../../db/client.js'
import type { Metrics } from '../../metrics.js'
import { Unavailable } from '../../errors.js'
import { errorResponses } from '../../schemas.js'

const READY_TIMEOUT_MS = 2_000

const Status = Type.Object({ status: Type.String() })

export const METRICS_CONTENT_TYPE = 'text/plain; version=0.0.4; charset=utf-8'

/**
 * For operators and orchestrators: liveness, readiness of the database, and metrics (here,
 * unless METRICS_PORT serves them on a listener of their own). No auth (`security: []`).
 */
export const healthRoutes: FastifyPluginAsyncTypebox<{ database: Database, metrics: Metrics, serveMetrics: boolean }> = async (app, { database, metrics, serveMetrics }) => {
  // Their 400: every route, these too, answers 400 to a malformed URL (frameworkErrors in
  // server-options.ts).
  app.get('/healthz', {
    schema: { operationId: 'checkLiveness', security: [], tags: ['operations'], summary: 'The process is running', response: { 200: Status, ...errorResponses(400) } }
  }, async () => ({ status: 'ok' }))

  app.get('/readyz', {
    schema: { operationId: 'checkReadiness', security: [], tags: ['operations'], summary: 'The database answers', response: { 200: Status, ...errorResponses(400, 503) } }
  }, async () => {
    let timer: NodeJS.Timeout | undefined
    const timeout = new Promise<never>((_resolve, reject) => {
      timer = setTimeout(() => reject(new Unavailable('The database did not answer within 2 s')), READY_TIMEOUT_MS)
    })
    try {
      await Promise.race([database.ping(), timeout])
    } catch (err) {
      throw err instanceof Unavailable ? err : new Unavailable()
    } finally {
      clearTimeout(timer)
    }
    return { status: 'ready' }
  })

  if (!serveMetrics) return
  app.get('/metrics', {
    schema: { tags: ['operations'], summary: 'Prometheus metrics (text exposition format)', hide: true }
  }, async (_req, reply) => reply.type(METRICS_CONTENT_TYPE).send(await metrics.render()))
}
