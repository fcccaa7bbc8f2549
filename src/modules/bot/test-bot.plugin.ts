import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import type { Db } from '../../db/client.js'
import type { FeedWaiting } from '../events/feed-waiting.js'
import { createTestBot } from './test-bot.js'

export interface TestBotPluginOptions {
  db: Db
  /** The bot's own address (TEST_BOT_ADDRESS). */
  address: string
  /** Waits on the bot's feed (the event bus's). */
  feed: FeedWaiting
}

/** The test bot, woken by the event bus: answers once the app is ready, stopped at shutdown. */
export const testBotPlugin = fp(async (app: FastifyInstance, opts: TestBotPluginOptions) => {
  const bot = createTestBot(opts.db, opts.feed, opts.address, app.log)
  app.addHook('onReady', async () => { bot.start() })
  app.addHook('preClose', async () => { await bot.stop() })
}, { name: 'test-bot', dependencies: ['event-bus'] })
