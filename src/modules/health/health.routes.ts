import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import { Type } from 'typebox'
import type { Database } from '../../db/client.js'
import { Unavailable } from '../../errors.js'
import { errorResponses } from '../../schemas.js'

const READY_TIMEOUT_MS = 2_000

const Status = Type.Object({ status: Type.String() })

/** Probes for orchestrators: liveness of the process, readiness of the database. No auth. */
export const healthRoutes: FastifyPluginAsyncTypebox<{ database: Database }> = async (app, { database }) => {
  app.get('/healthz', {
    schema: { tags: ['operations'], summary: 'The process is running', response: { 200: Status } }
  }, async () => ({ status: 'ok' }))

  app.get('/readyz', {
    schema: { tags: ['operations'], summary: 'The database answers', response: { 200: Status, ...errorResponses(503) } }
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
}
