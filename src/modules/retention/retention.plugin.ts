import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import type { Db } from '../../db/client.js'
import { startRetention } from './retention.js'

export interface RetentionPluginOptions {
  db: Db
  auditRetentionDays: number
}

/** The retention sweep's timer: started once the app is ready, stopped first at shutdown. */
export const retentionPlugin = fp(async (app: FastifyInstance, opts: RetentionPluginOptions) => {
  let stop: (() => void) | undefined
  app.addHook('onReady', async () => { stop = startRetention(opts.db, app.log, opts.auditRetentionDays) })
  app.addHook('preClose', async () => { stop?.() })
}, { name: 'retention' })
