/**
 * `npm run bench:export`: one user's export (GET /v2/export) of EXPORT_MESSAGES messages
 * (default 100,000, half sent and half received, each with a delivery row) and EXPORT_FILES
 * files of 16 MiB (default 64: 1 GiB), downloaded from a real `parley serve` as fast as this
 * process reads: its rate in MiB/s and messages/s, the time to its first byte, and the server's
 * RSS before and at peak. Twice: files of random bytes (incompressible, as most uploads) are
 * written by SQL in the database, so the bench measures the export, not the fill.
 *
 * The rows are written plain, so the service seals them as it starts (API.md §11), as it would
 * an existing database; the downloads wait for that pass, and so read sealed records, as every
 * export of a database written by the service does.
 *
 * Environment: BENCH_DATABASE_URL (an admin URL, default postgres://postgres@127.0.0.1:5432/postgres),
 * EXPORT_MESSAGES, EXPORT_FILES, PROFILE_DIR (the server runs under --cpu-prof, its profile
 * written there when it stops).
 */
import { request } from 'node:http'
import { sql } from 'drizzle-orm'
import { connectPostgres } from '../src/db/client.js'
import { createSettingsRepository } from '../src/db/settings.repository.js'
import { SEALED_ONCE } from '../src/sealing/background-seal.js'
import { createFixtures, freshDatabase, startService, type Key, type Service } from './fixtures.js'

const ADMIN_URL = process.env.BENCH_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres'
const MESSAGES = Number(process.env.EXPORT_MESSAGES ?? 100_000)
const FILES = Number(process.env.EXPORT_FILES ?? 64)
const PROFILE_DIR = process.env.PROFILE_DIR
const FILE_BYTES = 16 * 1024 * 1024
const CHUNK_BYTES = 256 * 1024

/** Downloads the caller's export, counting bytes; the server's RSS sampled every 50 ms. */
function download (service: Service, key: Key): Promise<{ bytes: number, seconds: number, firstByteMs: number, peakRss: number }> {
  return new Promise((resolve, reject) => {
    const started = performance.now()
    let peakRss = service.rss()
    const sampler = setInterval(() => { peakRss = Math.max(peakRss, service.rss()) }, 50)
    request(`${service.url}/v2/export`, { headers: { authorization: key.authorization } }, (res) => {
      const firstByteMs = performance.now() - started
      if (res.statusCode !== 200) reject(new Error(`export: ${res.statusCode}`))
      let bytes = 0
      res.on('data', (chunk: Buffer) => { bytes += chunk.length })
      res.on('end', () => {
        clearInterval(sampler)
        resolve({ bytes, seconds: (performance.now() - started) / 1000, firstByteMs, peakRss: Math.max(peakRss, service.rss()) })
      })
      res.on('error', reject)
    }).on('error', reject).end()
  })
}

async function main (): Promise<void> {
  const database = await freshDatabase(ADMIN_URL)
  try {
    const f = await createFixtures(database.url, { pairs: 1, groups: 0, pollers: 0, idlers: 0 })
    const [alice, bob] = [f.senders[0]!, f.receivers[0]!]
    const filler = await connectPostgres(database.url, 2)
    const started = performance.now()
    try {
      await filler.db.execute(sql`
        INSERT INTO messages (id, sender, recipient, body, created_at)
        SELECT 'msg_0' || lpad(g::text, 25, '0'),
          CASE WHEN g % 2 = 0 THEN ${alice.address} ELSE ${bob.address} END, CASE WHEN g % 2 = 0 THEN ${bob.address} ELSE ${alice.address} END,
          'export bench message number ' || g || ', of about the length of a chat line', now() - make_interval(secs => ${MESSAGES} - g)
        FROM generate_series(1, ${MESSAGES}) g`)
      await filler.db.execute(sql`INSERT INTO deliveries (message_id, recipient, status) SELECT id, recipient, 'read' FROM messages`)
      await filler.db.execute(sql`
        INSERT INTO attachments (message_id, n, filename, content_type, size, sha256, upload_id)
        SELECT 'msg_0' || lpad((g * 2)::text, 25, '0'), 1, 'file' || g || '.bin', 'application/octet-stream', ${FILE_BYTES}, repeat('0', 64), 'upl_' || g
        FROM generate_series(1, ${FILES}) g`)
      // Random bytes (gen_random_bytes needs pgcrypto): md5 of counters, incompressible enough
      // that TOAST stores them whole.
      for (let file = 1; file <= FILES; file++) {
        await filler.db.execute(sql`
          INSERT INTO attachment_chunks (upload_id, seq, message_id, data)
          SELECT 'upl_' || ${file}::int, s, 'msg_0' || lpad((${file}::int * 2)::text, 25, '0'),
            (SELECT string_agg(decode(md5(${file}::int || ':' || s || ':' || b), 'hex'), ''::bytea) FROM generate_series(1, ${CHUNK_BYTES / 16}) b)
          FROM generate_series(0, ${FILE_BYTES / CHUNK_BYTES - 1}) s`)
      }
      await filler.db.execute(sql`ANALYZE`)
    } finally {
      await filler.close()
    }
    console.log(`${MESSAGES} messages and ${FILES} files of 16 MiB written in ${((performance.now() - started) / 1000).toFixed(0)} s`)

    const service = await startService(database.url, { RATE_LIMIT_PER_SECOND: '1000000' },
      PROFILE_DIR === undefined ? [] : ['--cpu-prof', `--cpu-prof-dir=${PROFILE_DIR}`])
    try {
      const sealing = performance.now()
      const watcher = await connectPostgres(database.url, 1)
      try {
        const settings = createSettingsRepository(watcher.db)
        // The pass seals about 1,000 messages a second here; a failed or stopped one never records it.
        const deadline = Date.now() + 30 * 60_000
        while (!await settings.has(SEALED_ONCE)) {
          if (service.child.exitCode !== null) throw new Error(`the service exited with ${service.child.exitCode} while sealing`)
          if (Date.now() > deadline) throw new Error('the service\'s sealing pass did not finish in 30 minutes (its log says why)')
          await new Promise((resolve) => setTimeout(resolve, 500))
        }
      } finally {
        await watcher.close()
      }
      console.log(`sealed by the service's start in ${((performance.now() - sealing) / 1000).toFixed(0)} s`)
      console.log('| run | archive | time | rate | messages/s | first byte | server RSS before → peak |')
      console.log('|---|---|---|---|---|---|---|')
      for (const run of [1, 2]) {
        const before = service.rss()
        const r = await download(service, alice)
        const mib = r.bytes / 2 ** 20
        console.log(`| ${run} | ${mib.toFixed(0)} MiB | ${r.seconds.toFixed(1)} s | ${(mib / r.seconds).toFixed(0)} MiB/s | ${(MESSAGES / r.seconds).toFixed(0)} | ` +
          `${r.firstByteMs.toFixed(0)} ms | ${(before / 2 ** 20).toFixed(0)} → ${(r.peakRss / 2 ** 20).toFixed(0)} MiB |`)
      }
    } finally {
      await service.stop()
    }
  } finally {
    await database.drop()
  }
}

await main()
