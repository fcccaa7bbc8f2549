import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import type { Db } from '../../db/client.js'
import { startRetention } from './retention.js'

export interface RetentionPluginOptions {
  db: Db
  auditRetentionDays: number
  messageRetentionDays: number | undefined
}

/** The retention sweep's timer: started once the app is ready, stopped first at shutdown. */
export const retentionPlugin = fp(async (app: FastifyInstance, opts: RetentionPluginOptions) => {
  let stop: (() => Promise<void>) | undefined
  app.addHook('onReady', async () => { stop = startRetention(opts.db, app.log, opts) })
  // Waits for a sweep under way to end its current batch: the database closes after this.
  app.addHook('preClose', async () => { await stop?.() })
}, { name: 'retention' })
