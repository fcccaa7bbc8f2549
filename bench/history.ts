/**
 * `npm run bench:history`: a conversation's history page (GET /v2/conversations/{peer}/messages)
 * at the newest and deep, in a table of HISTORY_MESSAGES messages (default 1,000,000: half of
 * them the measured conversation's, the rest other users'), then edits and reactions per
 * second through the real server, one client at a time and CONCURRENCY at once. The table is
 * filled by SQL (the send path is measured elsewhere); the service runs as `parley serve`.
 *
 * Environment: BENCH_DATABASE_URL (an admin URL, default postgres://postgres@127.0.0.1:5432/postgres),
 * HISTORY_MESSAGES, HISTORY_PAGES (pages timed per position, default 300).
 */
import { connectPostgres } from '../src/db/client.js'
import { queryRows } from '../src/db/rows.js'
import { sql } from 'drizzle-orm'
import { createFixtures, freshDatabase, startService } from './fixtures.js'
import { percentiles } from './pollers.js'

const ADMIN_URL = process.env.BENCH_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres'
const MESSAGES = Number(process.env.HISTORY_MESSAGES ?? 1_000_000)
const PAGES = Number(process.env.HISTORY_PAGES ?? 300)
const CONCURRENCY = 10
const SECONDS = 5

/** Runs `work` from `clients` loops for SECONDS; answers completions per second. */
async function rate (clients: number, work: (client: number, i: number) => Promise<void>): Promise<number> {
  const until = performance.now() + SECONDS * 1000
  let done = 0
  await Promise.all(Array.from({ length: clients }, async (_, client) => {
    for (let i = 0; performance.now() < until; i++) {
      await work(client, i)
      done++
    }
  }))
  return done / SECONDS
}

async function main (): Promise<void> {
  const database = await freshDatabase(ADMIN_URL)
  try {
    const f = await createFixtures(database.url, { pairs: CONCURRENCY, groups: 0, pollers: 0, idlers: 0 })
    const [alice, bob] = [f.senders[0]!, f.receivers[0]!]
    const admin = await connectPostgres(database.url, 1)
    const started = performance.now()
    await admin.db.execute(sql`INSERT INTO users (address) SELECT kind || g FROM generate_series(0, 999) g, (VALUES ('other'), ('else')) AS k(kind)`)
    // Ids in time order, as the service makes them: msg_ and 26 characters. Half alice <-> bob in
    // turn, half between other pairs, interleaved as real traffic is.
    await admin.db.execute(sql`
      INSERT INTO messages (id, sender, recipient, body)
      SELECT 'msg_' || lpad(to_hex(g), 26, '0'),
        CASE WHEN g % 4 = 0 THEN ${alice.address} WHEN g % 4 = 1 THEN ${bob.address} ELSE 'other' || (g % 1000) END,
        CASE WHEN g % 4 = 0 THEN ${bob.address} WHEN g % 4 = 1 THEN ${alice.address} ELSE 'else' || (g % 1000) END,
        'history bench message ' || g
      FROM generate_series(1, ${MESSAGES}) g`)
    await admin.db.execute(sql`INSERT INTO deliveries (message_id, recipient, status) SELECT id, recipient, 'read' FROM messages`)
    await admin.db.execute(sql`ANALYZE messages`)
    await admin.db.execute(sql`ANALYZE deliveries`)
    const [conversation] = await queryRows<{ n: number }>(admin.db, sql`SELECT count(*)::int AS n FROM messages WHERE sender IN (${alice.address}, ${bob.address}) AND recipient IN (${alice.address}, ${bob.address})`)
    await admin.close()
    console.log(`${MESSAGES} messages (${conversation!.n} in the measured conversation) written in ${((performance.now() - started) / 1000).toFixed(0)} s`)

    const service = await startService(database.url, { RATE_LIMIT_PER_SECOND: '1000000', DAILY_MESSAGE_QUOTA: '1000000000' })
    try {
      const page = async (query: string): Promise<number> => {
        const t0 = performance.now()
        const res = await fetch(`${service.url}/v2/conversations/${bob.address}/messages?limit=50${query}`, { headers: { authorization: alice.authorization } })
        const body = await res.json() as { messages: unknown[] }
        if (res.status !== 200 || body.messages.length !== 50) throw new Error(`page ${query}: ${res.status}`)
        return performance.now() - t0
      }
      const deep = `msg_${(Math.floor(MESSAGES / 2)).toString(16).padStart(26, '0')}`
      const oldest = `msg_${(1).toString(16).padStart(26, '0')}`
      console.log('| page of 50 | pages | p50 | p99 |')
      console.log('|---|---|---|---|')
      for (const [what, query] of [['newest', ''], ['deep, back from the middle', `&from=${deep}`], ['deep, forward from the oldest', `&from=${oldest}&dir=forward`]] as const) {
        for (let i = 0; i < 20; i++) await page(query)
        const times: number[] = []
        for (let i = 0; i < PAGES; i++) times.push(await page(query))
        const p = percentiles(times)
        console.log(`| ${what} | ${PAGES} | ${p.p50.toFixed(1)} ms | ${p.p99.toFixed(1)} ms |`)
      }

      // Edits and reactions: each client on a message of its own pair, in a fresh conversation.
      const ids: string[] = []
      for (let c = 0; c < CONCURRENCY; c++) {
        const res = await fetch(`${service.url}/v2/message`, {
          method: 'POST', headers: { authorization: f.senders[c]!.authorization, 'content-type': 'application/json' }, body: JSON.stringify({ recipient: f.receivers[c]!.address, body: 'edit me' })
        })
        ids.push((await res.json() as { id: string }).id)
      }
      const edit = (client: number, i: number) => fetch(`${service.url}/v2/message/${ids[client]}`, {
        method: 'PATCH', headers: { authorization: f.senders[client]!.authorization, 'content-type': 'application/json' }, body: JSON.stringify({ body: `edit ${i}` })
      }).then(async (r) => { if (r.status !== 200) throw new Error(`edit: ${r.status} ${await r.text()}`) })
      const react = (client: number, i: number) => fetch(`${service.url}/v2/message/${ids[client]}/reactions/e${i % 2}`, {
        method: i % 4 < 2 ? 'PUT' : 'DELETE', headers: { authorization: f.receivers[client]!.authorization }
      }).then(async (r) => { if (r.status !== 204) throw new Error(`reaction: ${r.status} ${await r.text()}`) })
      console.log('')
      console.log('| write | 1 client | 10 clients |')
      console.log('|---|---|---|')
      console.log(`| edit (PATCH /v2/message/{id}) | ${(await rate(1, edit)).toFixed(0)}/s | ${(await rate(CONCURRENCY, edit)).toFixed(0)}/s |`)
      console.log(`| reaction change (PUT/DELETE …/reactions/{emoji}) | ${(await rate(1, react)).toFixed(0)}/s | ${(await rate(CONCURRENCY, react)).toFixed(0)}/s |`)
    } finally {
      await service.stop()
    }
  } finally {
    await database.drop()
  }
}

await main()
