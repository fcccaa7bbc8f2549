import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import type { Db } from '../../db/client.js'
import { startErasure, type ErasureJob } from './erasure.js'
import type { ErasureBatch } from './erasure.service.js'

declare module 'fastify' {
  interface FastifyInstance {
    /** The erasure job: the admin route wakes it once a request is recorded. */
    erasure: Pick<ErasureJob, 'wake'>
  }
}

export interface ErasurePluginOptions {
  db: Db
  /** erasureGraceMs(REQUEST_TIMEOUT_SECONDS), or a test's own. */
  graceMs: number
  /** ERASURE_BATCH unless a test makes batches small. */
  batch?: ErasureBatch | undefined
  /** False: this instance records erasures and leaves the work to other instances (or to a test). */
  background?: boolean | undefined
}

/** The erasure job's timers: started once the app is ready, stopped at shutdown after its current batch. */
export const erasurePlugin = fp(async (app: FastifyInstance, opts: ErasurePluginOptions) => {
  let job: ErasureJob | undefined
  app.decorate('erasure', { wake: () => job?.wake() })
  app.addHook('onReady', async () => {
    if (opts.background !== false) job = startErasure(opts.db, app.log, { graceMs: opts.graceMs, batch: opts.batch })
  })
  // The database closes after this: the batch under way commits (or rolls back) first.
  app.addHook('preClose', async () => { await job?.stop() })
}, { name: 'erasure' })
