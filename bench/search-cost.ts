/**
 * Scenario 9, search cost on a large table: 300,000 messages that one sender wrote to 100
 * users, then POST /v2/search "a" (a one-letter prefix: nearly every message matches) by a
 * user who can read 3 of them and by the sender, who can read them all. Each search is timed
 * end to end over HTTP, one at a time; the small reader's query is also timed as the table-first
 * plan alone (what every search ran before the reader-first plan), straight on PostgreSQL.
 * See BENCHMARKS.md.
 */
import pg from 'pg'
import { connectPostgres } from '../src/db/client.js'
import { messageSearchQuery } from '../src/modules/search/message-search.js'
import { queryTerms } from '../src/sealing/search-terms.js'
import { sql } from 'drizzle-orm'
import { queryRows } from '../src/db/rows.js'
import { installKeyring, Keyring, parseSealingKeys } from '../src/sealing/keyring.js'
import { runSealingPass } from '../src/sealing/reseal.js'
import { BENCH_SEALING_KEYS, type Key } from './fixtures.js'

interface SearchCostRow { who: string, readable: number, plan: string, p50: number, p99: number }
export interface SearchCostResult {
  messages: number
  /** Sealing the messages written plain (the pass an existing database gets): seconds, and the search index's size after. */
  sealing: { seconds: number, messagesPerSecond: number, searchIndexBytes: number }
  rows: SearchCostRow[]
}

const MESSAGES = 300_000
const TIMES = 40

const percentile = (sorted: number[], p: number): number => sorted[Math.min(sorted.length - 1, Math.ceil(sorted.length * p) - 1)] ?? 0

async function timed (times: number, run: () => Promise<void>): Promise<{ p50: number, p99: number }> {
  const took: number[] = []
  for (let i = 0; i < times; i++) {
    const started = performance.now()
    await run()
    took.push(performance.now() - started)
  }
  took.sort((a, b) => a - b)
  return { p50: percentile(took, 0.5), p99: percentile(took, 0.99) }
}

export async function searchCost (url: string, databaseUrl: string, writer: Key, smallReader: Key): Promise<SearchCostResult> {
  const client = new pg.Client({ connectionString: databaseUrl })
  await client.connect()
  try {
    await client.query("INSERT INTO users (address) SELECT 'reader' || g FROM generate_series(1, 100) g ON CONFLICT DO NOTHING")
    await client.query(`
      WITH written AS (
        INSERT INTO messages (id, sender, recipient, body, created_at)
        SELECT 'msg_search' || lpad(g::text, 20, '0'), $1, 'reader' || (g % 100 + 1),
               'a note about apples and ' || md5(g::text), now() - (g || ' seconds')::interval
        FROM generate_series(1, ${MESSAGES}) g
        RETURNING id, recipient)
      INSERT INTO deliveries (message_id, recipient) SELECT id, recipient FROM written`, [writer.address])
    await client.query(`
      WITH written AS (
        INSERT INTO messages (id, sender, recipient, body)
        SELECT 'msg_searchsmall' || lpad(g::text, 15, '0'), $1, $2, 'a message for the small reader ' || g FROM generate_series(1, 3) g
        RETURNING id, recipient)
      INSERT INTO deliveries (message_id, recipient) SELECT id, recipient FROM written`, [writer.address, smallReader.address])
    await client.query('ANALYZE')
  } finally {
    await client.end()
  }

  const search = (key: Key) => async () => {
    const res = await fetch(`${url}/v2/search`, {
      method: 'POST', headers: { authorization: key.authorization, 'content-type': 'application/json' }, body: JSON.stringify({ query: 'a', types: ['messages'], limit: 50 })
    })
    if (res.status !== 200) throw new Error(`search answered ${res.status}: ${await res.text()}`)
    await res.arrayBuffer()
  }
  const database = await connectPostgres(databaseUrl, 1)
  try {
    // Written plain, as a database from before sealing: sealed (and their words hashed) by the
    // pass `parley migrate` and every start run, here in this process under the bench's key.
    installKeyring(new Keyring(parseSealingKeys(BENCH_SEALING_KEYS)))
    const sealingStarted = performance.now()
    await runSealingPass(database.db, { mode: 'plain', rest: false })
    const seconds = (performance.now() - sealingStarted) / 1000
    await database.db.execute(sql`ANALYZE messages`)
    const [index] = await queryRows<{ bytes: number }>(database.db, sql`SELECT pg_relation_size('messages_search_idx')::bigint::float8 AS bytes`)
    const sealing = { seconds, messagesPerSecond: (MESSAGES + 3) / seconds, searchIndexBytes: index!.bytes }
    const tableFirst = await timed(TIMES, async () => { await messageSearchQuery(database.db, { viewer: smallReader.address, terms: queryTerms('ap'), limit: 51 }) })
    return {
      messages: MESSAGES,
      sealing,
      rows: [
        { who: 'a reader of 3 messages', readable: 3, plan: 'table-first (GIN index, then permission filter), SQL alone', ...tableFirst },
        { who: 'a reader of 3 messages', readable: 3, plan: 'the service (reader-first), over HTTP', ...await timed(TIMES, search(smallReader)) },
        { who: 'the writer of all of them', readable: MESSAGES + 3, plan: 'the service (table-first), over HTTP', ...await timed(TIMES, search(writer)) }
      ]
    }
  } finally {
    await database.close()
  }
}
