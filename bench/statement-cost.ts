/**
 * `npm run bench:statements`: what a send's statement costs PostgreSQL as a named prepared
 * statement (parsed and planned once per connection) and unnamed (parsed and planned on every
 * execution, as through a transaction pooler: DATABASE_POOLER=transaction). The send batch's
 * statement (writeBatch) run one after another on one connection, alone and 16 sends at a time,
 * in alternating blocks so the machine's drift falls on both. No HTTP: the database's side only.
 *
 * Environment: BENCH_DATABASE_URL (an admin URL, default postgres://postgres@127.0.0.1:5432/postgres).
 */
import { connectPostgres, type Database } from '../src/db/client.js'
import { writeBatch, type BatchSend } from '../src/modules/messages/send-batch.repository.js'
import { batchSendOf, newMessage } from '../src/modules/messages/send.service.js'
import { createFixtures, freshDatabase, type Key } from './fixtures.js'
import { percentiles } from './pollers.js'

const ADMIN_URL = process.env.BENCH_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres'
const BLOCKS = 6
const PER_BLOCK = 300

function sendOf (from: Key, to: Key, n: number): BatchSend {
  const message = newMessage({ sender: from.address, recipient: to.address, body: `statement cost ${n}`, files: [] })
  return batchSendOf(message, { files: [], toGroup: false, countsAgainst: { keyId: from.keyId, dailyQuota: 1_000_000_000 } })
}

async function main (): Promise<void> {
  const database = await freshDatabase(ADMIN_URL)
  const open: Database[] = []
  try {
    const f = await createFixtures(database.url, { pairs: 16, groups: 1, pollers: 0, idlers: 0 })
    const named = await connectPostgres(database.url, 1)
    const unnamed = await connectPostgres(database.url, 1, { pooler: 'transaction' })
    open.push(named, unnamed)
    const times = new Map<string, number[]>()
    let n = 0
    for (let block = 0; block < BLOCKS; block++) {
      for (const [mode, db] of [['named', named], ['unnamed', unnamed]] as const) {
        for (const size of [1, 16]) {
          const key = `${mode} ${size}`
          const list = times.get(key) ?? []
          times.set(key, list)
          // Every batch of one size has one shape: one statement text, prepared once when named.
          for (let i = 0; i < PER_BLOCK / (size === 1 ? 1 : 4); i++) {
            const sends = Array.from({ length: size }, (_, j) => sendOf(f.senders[j]!, f.receivers[j]!, n++))
            const started = performance.now()
            await writeBatch(db.db, sends)
            if (i > 5 || block > 0) list.push(performance.now() - started)
          }
        }
      }
    }
    console.log('| statement | executions | p50 | p90 | p99 |')
    console.log('|---|---|---|---|---|')
    for (const [key, list] of times) {
      const p = percentiles(list)
      const [mode, size] = key.split(' ')
      console.log(`| send batch of ${size}, ${mode} | ${list.length} | ${p.p50.toFixed(2)} ms | ${p.p90.toFixed(2)} ms | ${p.p99.toFixed(2)} ms |`)
    }
  } finally {
    await Promise.all(open.map((d) => d.close()))
    await database.drop()
  }
}

main().catch((err: unknown) => {
  console.error(err)
  process.exit(1)
})
