import type { FastifyInstance } from 'fastify'
import { scrape } from './metrics.js'
import { until } from './until.js'

/**
 * Resolves once each app's webhook dispatcher has begun a look for due webhooks after this
 * call, finished it, and has no batch running: whatever was due when it was called has been
 * sent by then (and answered: a batch ends once its receiver has). For asserting that nothing
 * more is sent, instead of sleeping for as long as that might take.
 */
export async function webhooksSettled (apps: FastifyInstance[], timeoutMs = 10_000): Promise<void> {
  const sweeps = (read: (series: string) => number | undefined) => read('parley_webhook_sweeps_total') ?? NaN
  // The look under way now may have begun before the call: the one after it has not.
  const from = await Promise.all(apps.map(async (app) => sweeps(await scrape(app))))
  await until(async () => {
    const now = await Promise.all(apps.map((app) => scrape(app)))
    return now.every((read, i) => sweeps(read) >= from[i]! + 2 && read('parley_webhook_batches_active') === 0)
  }, { timeoutMs, message: `the webhook dispatchers did not settle within ${timeoutMs} ms` })
}
