/**
 * `npm run bench:retention`: purging a backlog of RETENTION_MESSAGES old messages (default
 * 1,000,000, each with a delivery row and a message.received event, one in ten with a
 * reaction) as the retention sweep does it (500 a transaction, resting as long as each batch
 * took), while one key sends through the real server one message at a time: the purge's rate,
 * and the sender's latency alone and during the purge. The table is filled by SQL; the service
 * runs as `parley serve` without MESSAGE_RETENTION_DAYS (this process purges, with a pool of its own).
 *
 * Environment: BENCH_DATABASE_URL (an admin URL, default postgres://postgres@127.0.0.1:5432/postgres),
 * RETENTION_MESSAGES.
 */
import { setTimeout as sleep } from 'node:timers/promises'
import { sql } from 'drizzle-orm'
import { connectPostgres } from '../src/db/client.js'
import { purgeExpired } from '../src/modules/retention/retention.js'
import { createFixtures, freshDatabase, startService, type Key } from './fixtures.js'
import { percentiles } from './pollers.js'

const ADMIN_URL = process.env.BENCH_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres'
const MESSAGES = Number(process.env.RETENTION_MESSAGES ?? 1_000_000)
const ALONE_SECONDS = 10
const SEND_EVERY_MS = 20

/** Sends one message at a time (at most one per SEND_EVERY_MS) until `done` settles; each latency. */
async function sender (url: string, from: Key, to: string, done: Promise<unknown>): Promise<number[]> {
  let over = false
  void done.finally(() => { over = true })
  const times: number[] = []
  while (!over) {
    const started = performance.now()
    const res = await fetch(`${url}/v2/message`, {
      method: 'POST', headers: { authorization: from.authorization, 'content-type': 'application/json' }, body: JSON.stringify({ recipient: to, body: 'still here' })
    })
    await res.arrayBuffer()
    if (res.status !== 200) throw new Error(`send: ${res.status}`)
    times.push(performance.now() - started)
    await sleep(Math.max(0, SEND_EVERY_MS - (performance.now() - started)))
  }
  return times
}

async function main (): Promise<void> {
  const database = await freshDatabase(ADMIN_URL)
  try {
    const f = await createFixtures(database.url, { pairs: 2, groups: 0, pollers: 0, idlers: 0 })
    const [alice, bob] = [f.senders[0]!, f.receivers[0]!]
    const purger = await connectPostgres(database.url, 2)
    const started = performance.now()
    await purger.db.execute(sql`
      INSERT INTO messages (id, sender, recipient, body, created_at)
      SELECT 'msg_0' || lpad(g::text, 25, '0'), ${alice.address}, ${bob.address}, 'retention bench message ' || g,
        now() - interval '400 days' + g * interval '10 milliseconds'
      FROM generate_series(1, ${MESSAGES}) g`)
    await purger.db.execute(sql`INSERT INTO deliveries (message_id, recipient, status) SELECT id, recipient, 'read' FROM messages`)
    await purger.db.execute(sql`
      INSERT INTO events (address, seq, type, data, message_id)
      SELECT recipient, 1000000000 + row_number() OVER (ORDER BY id), 'message.received', jsonb_build_object('message', jsonb_build_object('id', id)), id FROM messages`)
    await purger.db.execute(sql`UPDATE users SET event_seq = 1000000000 + ${MESSAGES} WHERE address = ${bob.address}`)
    await purger.db.execute(sql`INSERT INTO message_reactions (message_id, emoji, address) SELECT id, 'ok', ${bob.address} FROM messages WHERE right(id, 1) = '0'`)
    await purger.db.execute(sql`ANALYZE`)
    console.log(`${MESSAGES} old messages, with deliveries, events and reactions, written in ${((performance.now() - started) / 1000).toFixed(0)} s`)

    const service = await startService(database.url, { RATE_LIMIT_PER_SECOND: '1000000', DAILY_MESSAGE_QUOTA: '1000000000' })
    try {
      const [other, otherPeer] = [f.senders[1]!, f.receivers[1]!]
      const alone = await sender(service.url, other, otherPeer.address, sleep(ALONE_SECONDS * 1000))
      const purgeStarted = performance.now()
      const purge = purgeExpired(purger.db, 0, 365, { messageRetentionDays: 30, rest: true })
      const during = await sender(service.url, other, otherPeer.address, purge)
      const swept = await purge
      const seconds = (performance.now() - purgeStarted) / 1000
      const [a, d] = [percentiles(alone), percentiles(during)]
      console.log(`purged ${swept.messages} messages in ${seconds.toFixed(1)} s: ${(swept.messages / seconds).toFixed(0)} messages/s`)
      console.log('| a bystander\'s sends | sends | p50 | p99 | max |')
      console.log('|---|---|---|---|---|')
      console.log(`| alone | ${alone.length} | ${a.p50.toFixed(1)} ms | ${a.p99.toFixed(1)} ms | ${a.max.toFixed(1)} ms |`)
      console.log(`| during the purge | ${during.length} | ${d.p50.toFixed(1)} ms | ${d.p99.toFixed(1)} ms | ${d.max.toFixed(1)} ms |`)
    } finally {
      await service.stop()
      await purger.close()
    }
  } finally {
    await database.drop()
  }
}

await main()
