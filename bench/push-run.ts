/**
 * Scenarios 10 and 11 alone (`npm run bench:push`): event-stream wake-up with 1,000 streams,
 * and webhook delivery throughput to a receiver on loopback. `npm run bench` runs them too.
 */
import { createFixtures, freshDatabase, startService } from './fixtures.js'
import { streamWakeUp, webhookThroughput } from './push.js'

const ADMIN_URL = process.env.BENCH_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres'

const database = await freshDatabase(ADMIN_URL)
try {
  const f = await createFixtures(database.url, { pairs: 50, groups: 0, pollers: 1_000, idlers: 0 })
  const service = await startService(database.url, { LOG_LEVEL: 'warn', RATE_LIMIT_PER_SECOND: '1000000', WEBHOOK_ALLOW_PRIVATE: 'true' })
  try {
    const streams = await streamWakeUp(service.url, f.pollers, f.senders)
    console.log(`10. event-stream wake-up, ${streams.streams} streams: after the send's 200 p50 ${streams.afterSend.p50.toFixed(1)} ms, p99 ${streams.afterSend.p99.toFixed(1)} ms, max ${streams.afterSend.max.toFixed(1)} ms`)
    const hooks = await webhookThroughput(service.url, database.url, f.pollers.slice(0, 10), f.senders, 500)
    console.log(`11. webhooks: ${hooks.events} events to ${hooks.webhooks} webhooks while sent, ${hooks.eventsPerSecond.toFixed(0)} events/s; send's 200 to arrival p50 ${hooks.latency.p50.toFixed(1)} ms, p99 ${hooks.latency.p99.toFixed(1)} ms; a backlog of as many: ${hooks.backlogEventsPerSecond.toFixed(0)} events/s`)
  } finally {
    await service.stop()
  }
} finally {
  await database.drop()
}
