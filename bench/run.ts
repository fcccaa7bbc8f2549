/**
 * `npm run bench`: the service from this checkout on the machine's PostgreSQL, in a database
 * made for the run, under autocannon; the same send's SQL under pgbench as the limit to compare
 * with. Prints a table and writes bench/results/<date>.json. See BENCHMARKS.md.
 *
 * Environment: BENCH_DATABASE_URL (an admin URL, default postgres://postgres@127.0.0.1:5432/postgres),
 * BENCH_SECONDS (10) and BENCH_WARMUP_SECONDS (3) per scenario. BENCH_POOLER: `none` (default:
 * the service on PostgreSQL itself, named statements), `unnamed` (the same, with the unnamed
 * statements a transaction pooler needs: DATABASE_POOLER=transaction), or `pgbouncer` (through a
 * PgBouncer in transaction mode the bench starts, one server connection per service connection;
 * LISTEN and migrations direct). BENCH_ONLY: a comma-separated list of `sends` (scenarios 1-3)
 * and `wake` (4 and 10): only those, without pgbench, into bench/results/<date>-<list>-<pooler>.json;
 * or `search` alone: scenario 9 alone, printed.
 */
import { mkdirSync, writeFileSync } from 'node:fs'
import { cpus, totalmem } from 'node:os'
import { join } from 'node:path'
import autocannon from 'autocannon'
import pg from 'pg'
import { startPgbouncer, type Pgbouncer } from '../test/support/pgbouncer.js'
import { createFixtures, freshDatabase, ROOT, startService } from './fixtures.js'
import { pgbench, type PgbenchResult } from './pgbench.js'
import { noisyNeighbours } from './neighbours.js'
import { idlePollMemory, wakeUpLatency } from './pollers.js'
import { streamWakeUp, webhookThroughput } from './push.js'
import { searchCost } from './search-cost.js'
import { jsonSend, multipartSend, type Request } from './sends.js'
import { transfers } from './transfers.js'

const ADMIN_URL = process.env.BENCH_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres'
const SECONDS = Number(process.env.BENCH_SECONDS ?? 10)
const WARMUP = Number(process.env.BENCH_WARMUP_SECONDS ?? 3)
const PAIRS = 50
const POLLERS = 1_000
const IDLE_POLLS = 5_000
const POLLS_PER_KEY = 10
const POOLER = process.env.BENCH_POOLER ?? 'none'
const ONLY = process.env.BENCH_ONLY === undefined ? undefined : new Set(process.env.BENCH_ONLY.split(','))
if (!['none', 'unnamed', 'pgbouncer'].includes(POOLER)) throw new Error('BENCH_POOLER must be none, unnamed or pgbouncer')
if (ONLY !== undefined && (ONLY.size === 0 || [...ONLY].some((part) => part !== 'sends' && part !== 'wake' && part !== 'search'))) throw new Error('BENCH_ONLY must list sends, wake or search (or be unset)')
/** The service's pool (its default), and PgBouncer's server connections for it. */
const POOL_SIZE = 10

interface HttpRow { scenario: string, connections: number, rps: number, p50: number, p99: number, errors: number, limit?: PgbenchResult }

/** Runs one HTTP scenario: a warm-up, then the measured run; connection i makes request i. */
async function load (url: string, connections: number, requestFor: (i: number) => Request): Promise<{ rps: number, p50: number, p99: number, errors: number }> {
  const run = async (duration: number) => {
    let client = 0
    const first = requestFor(0)
    return autocannon({
      url: `${url}${first.path}`,
      method: first.method,
      connections,
      duration,
      setupClient: (c) => {
        const r = requestFor(client++ % connections)
        c.setHeadersAndBody(r.headers, r.body as string)
      }
    })
  }
  if (WARMUP > 0) await run(WARMUP)
  const result = await run(SECONDS)
  return {
    rps: result.requests.average,
    p50: result.latency.p50,
    p99: result.latency.p99,
    errors: result.errors + result.timeouts + result.non2xx
  }
}

async function machine (databaseUrl: string) {
  const client = new pg.Client({ connectionString: databaseUrl })
  await client.connect()
  const { rows } = await client.query<{ version: string }>('SELECT version()')
  await client.end()
  return { cpu: cpus()[0]?.model ?? 'unknown', cores: cpus().length, memoryGiB: Math.round(totalmem() / 2 ** 30), node: process.version, postgres: rows[0]!.version }
}

const ms = (n: number) => `${n.toFixed(1)} ms`
const mb = (n: number) => `${(n / 2 ** 20).toFixed(0)} MB`

async function main (): Promise<void> {
  const started = new Date()
  const database = await freshDatabase(ADMIN_URL)
  let service: Awaited<ReturnType<typeof startService>> | undefined
  let bouncer: Pgbouncer | undefined
  try {
    process.stdout.write('setting up users, keys and groups… ')
    const f = await createFixtures(database.url, { pairs: PAIRS, groups: PAIRS, pollers: ONLY === undefined || ONLY.has('wake') || ONLY.has('search') ? POLLERS : 0, idlers: ONLY === undefined ? IDLE_POLLS / POLLS_PER_KEY : 0 })
    console.log('done')
    if (POOLER === 'pgbouncer') bouncer = await startPgbouncer(database.url, { poolSize: POOL_SIZE })
    const pooled: Record<string, string> = bouncer === undefined ? {} : { DATABASE_DIRECT_URL: database.url }
    const unnamed: Record<string, string> = POOLER === 'unnamed' ? { DATABASE_DIRECT_URL: database.url, DATABASE_POOLER: 'transaction' } : {}
    service = await startService(bouncer?.url ?? database.url, {
      LOG_LEVEL: 'warn',
      RATE_LIMIT_PER_SECOND: '1000000',
      MAX_LONG_POLLS_PER_KEY: String(POLLS_PER_KEY),
      WEBHOOK_ALLOW_PRIVATE: 'true',
      DATABASE_POOL_SIZE: String(POOL_SIZE),
      ...pooled,
      ...unnamed
    })
    console.log(`the service on ${bouncer === undefined ? 'PostgreSQL directly' : 'PgBouncer (transaction mode)'}, ${POOLER === 'none' ? 'named' : 'unnamed'} statements`)
    const url = service.url
    const rows: HttpRow[] = []
    if (ONLY?.has('search') === true && ONLY.size === 1) {
      // Scenario 9 alone (its table, and the time it takes to seal it in BENCHMARKS.md).
      console.log('scenario 9: search "a" on 300,000 messages, by a reader of 3 and by their writer')
      const searching = await searchCost(url, database.url, f.senders[2]!, f.pollers[POLLERS - 1]!)
      console.log(JSON.stringify(searching, null, 2))
      return
    }
    if (ONLY !== undefined) {
      // First, as in the whole run: the LISTEN count reads the connection's last statement, the
      // heartbeat's SELECT 1 once LISTEN_HEARTBEAT_MS has passed since the start.
      let wake: Awaited<ReturnType<typeof wakeUpLatency>> | undefined
      let streams: Awaited<ReturnType<typeof streamWakeUp>> | undefined
      if (ONLY.has('wake')) {
        console.log('scenario 4: long-poll wake-up, 1,000 pollers')
        wake = await wakeUpLatency(url, database.url, f.pollers, f.senders)
        console.log('scenario 10: event-stream wake-up, 1,000 streams')
        streams = await streamWakeUp(url, f.pollers, f.senders)
      }
      if (ONLY.has('sends')) {
        for (const connections of [10, 50]) {
          console.log(`scenario 1: POST /v2/message JSON, ${connections} connections`)
          rows.push({ scenario: '1. send, JSON, 1:1', connections, ...await load(url, connections, (i) => jsonSend(f.senders[i]!, f.receivers[i]!.address)) })
        }
        console.log('scenario 2: POST /v2/message multipart with a 10 KiB image, 50 connections')
        rows.push({ scenario: '2. send, multipart, 10 KiB image', connections: 50, ...await load(url, 50, (i) => multipartSend(f.senders[i]!, f.receivers[i]!.address)) })
        console.log('scenario 3: group message to 20 members, 50 connections')
        rows.push({ scenario: '3. send to a group of 20', connections: PAIRS, ...await load(url, PAIRS, (i) => jsonSend(f.groups[i]!.sender, f.groups[i]!.id)) })
      }
      console.log('')
      console.log(`| scenario (BENCH_POOLER=${POOLER}) | connections | requests/s | p50 | p99 | errors |`)
      console.log('|---|---|---|---|---|---|')
      for (const r of rows) console.log(`| ${r.scenario} | ${r.connections} | ${r.rps.toFixed(0)} | ${ms(r.p50)} | ${ms(r.p99)} | ${r.errors} |`)
      if (wake !== undefined) console.log(`| 4. long-poll wake-up, ${wake.pollers} pollers, from the send's 200 | | | ${ms(wake.afterSend.p50)} | ${ms(wake.afterSend.p99)} | LISTEN connections: ${wake.listenConnections} |`)
      if (streams !== undefined) console.log(`| 10. event-stream wake-up, ${streams.streams} streams, from the send's 200 | | | ${ms(streams.afterSend.p50)} | ${ms(streams.afterSend.p99)} | |`)
      const file = join(ROOT, 'bench', 'results', `${started.toISOString().slice(0, 10)}-${[...ONLY].join('-')}-${POOLER}.json`)
      mkdirSync(join(ROOT, 'bench', 'results'), { recursive: true })
      writeFileSync(file, JSON.stringify({
        startedAt: started.toISOString(),
        machine: await machine(database.url),
        settings: { seconds: SECONDS, warmupSeconds: WARMUP, pairs: PAIRS, pooler: POOLER, poolSize: POOL_SIZE },
        http: rows,
        wakeUp: wake,
        streams
      }, null, 2) + '\n')
      console.log(`\nwrote ${file}`)
      return
    }

    console.log('scenario 4: long-poll wake-up, 1,000 pollers')
    const wake = await wakeUpLatency(url, database.url, f.pollers, f.senders)
    console.log('scenario 6: memory with 5,000 idle long-polls')
    const memory = await idlePollMemory(url, f.idlers, POLLS_PER_KEY, service.rss)
    console.log('scenario 10: event-stream wake-up, 1,000 streams')
    const streams = await streamWakeUp(url, f.pollers, f.senders)
    console.log('scenario 11: webhook delivery, 10 webhooks, 5,000 events, to a receiver on loopback')
    const webhooks = await webhookThroughput(url, database.url, f.pollers.slice(0, 10), f.senders, 500)

    const limits = new Map<number, PgbenchResult>()
    for (const connections of [10, 50]) {
      console.log(`limit: pgbench, the send's SQL, ${connections} clients`)
      limits.set(connections, await pgbench(database.url, connections, SECONDS))
    }
    for (const connections of [10, 50]) {
      console.log(`scenario 1: POST /v2/message JSON, ${connections} connections`)
      rows.push({ scenario: '1. send, JSON, 1:1', connections, ...await load(url, connections, (i) => jsonSend(f.senders[i]!, f.receivers[i]!.address)), limit: limits.get(connections)! })
    }
    for (const connections of [10, 50]) {
      console.log(`scenario 2: POST /v2/message multipart with a 10 KiB image, ${connections} connections`)
      rows.push({ scenario: '2. send, multipart, 10 KiB image', connections, ...await load(url, connections, (i) => multipartSend(f.senders[i]!, f.receivers[i]!.address)), limit: limits.get(connections)! })
    }
    console.log('scenario 3: group message to 20 members, 50 connections')
    rows.push({ scenario: '3. send to a group of 20', connections: PAIRS, ...await load(url, PAIRS, (i) => jsonSend(f.groups[i]!.sender, f.groups[i]!.id)), limit: limits.get(50)! })
    console.log('scenario 5: GET /v2/user/{user}, 50 connections')
    rows.push({
      scenario: '5. GET /v2/user/{user}',
      connections: PAIRS,
      ...await load(url, PAIRS, (i) => ({ path: `/v2/user/${f.receivers[i]!.address}`, method: 'GET', headers: { authorization: f.senders[i]!.authorization } }))
    })
    console.log('scenario 8: attachments, 4 sends of 10 x 25 MiB at once, then every file downloaded')
    const transfer = await transfers(url, f.senders.slice(1, 5), f.receivers[1]!, service.rss)
    // Last: its uploads and big groups leave rows behind that would slow the scenarios above.
    const neighbours = await noisyNeighbours(url, database.url, f.senders[0]!, f.receivers[0]!.address, f.senders[PAIRS - 1]!, Math.max(3, Math.round(SECONDS / 2)))
    console.log('scenario 9: search "a" on 300,000 messages, by a reader of 3 and by their writer')
    const searching = await searchCost(url, database.url, f.senders[2]!, f.pollers[POLLERS - 1]!)

    console.log('')
    console.log('| scenario | connections | requests/s | p50 | p99 | errors | pgbench tps (same SQL, same clients) | ratio |')
    console.log('|---|---|---|---|---|---|---|---|')
    for (const r of rows) {
      const limit = r.limit === undefined ? '' : r.limit.tps.toFixed(0)
      const ratio = r.limit === undefined ? '' : `${Math.round(100 * r.rps / r.limit.tps)}%`
      console.log(`| ${r.scenario} | ${r.connections} | ${r.rps.toFixed(0)} | ${ms(r.p50)} | ${ms(r.p99)} | ${r.errors} | ${limit} | ${ratio} |`)
    }
    console.log(`| 4. long-poll wake-up, ${wake.pollers} pollers | | | ${ms(wake.afterSend.p50)} | ${ms(wake.afterSend.p99)} | | LISTEN connections: ${wake.listenConnections} | |`)
    console.log(`| 6. RSS with ${memory.idlePolls} idle long-polls | | | | | | ${mb(memory.rssWithPolls)} (${mb(memory.rssBefore)} before, ${(memory.perPoll / 1024).toFixed(1)} KiB per poll) | |`)
    console.log(`| 10. event-stream wake-up, ${streams.streams} streams | | | ${ms(streams.afterSend.p50)} | ${ms(streams.afterSend.p99)} | | | |`)
    console.log(`| 11. webhook delivery, ${webhooks.webhooks} webhooks, ${webhooks.events} events while sent | | ${webhooks.eventsPerSecond.toFixed(0)} events/s | ${ms(webhooks.latency.p50)} | ${ms(webhooks.latency.p99)} | | a backlog of as many: ${webhooks.backlogEventsPerSecond.toFixed(0)} events/s | |`)
    console.log(`| 8. attachments: ${transfer.mib} MiB up, 4 sends at once; then down, 4 at once | | | | | | upload ${transfer.uploadMiBps.toFixed(0)} MiB/s, download ${transfer.downloadMiBps.toFixed(0)} MiB/s, peak RSS ${mb(transfer.peakRss)} (${mb(transfer.rssBefore)} before) | |`)

    console.log('')
    console.log('| 7. noisy neighbour: abuse by one key (rate limit off) | bystander sends | p50 | p99 | max | bystander non-200 | abuser requests (statuses) |')
    console.log('|---|---|---|---|---|---|---|')
    for (const n of neighbours) {
      const statuses = Object.entries(n.abuser.statuses).map(([code, count]) => `${count} × ${code}`).join(', ')
      console.log(`| ${n.abuse} | ${n.bystander.sends} | ${ms(n.bystander.p50)} | ${ms(n.bystander.p99)} | ${ms(n.bystander.max)} | ${n.bystander.non200} | ${n.abuser.requests}${statuses === '' ? '' : ` (${statuses})`} |`)
    }

    console.log('')
    console.log(`| 9. search "a" on ${searching.messages.toLocaleString('en')} messages, by | messages it can read | plan | p50 | p99 |`)
    console.log('|---|---|---|---|---|')
    for (const r of searching.rows) console.log(`| ${r.who} | ${r.readable.toLocaleString('en')} | ${r.plan} | ${ms(r.p50)} | ${ms(r.p99)} |`)

    const day = started.toISOString().slice(0, 10)
    const dir = join(ROOT, 'bench', 'results')
    mkdirSync(dir, { recursive: true })
    const file = join(dir, `${day}.json`)
    writeFileSync(file, JSON.stringify({
      startedAt: started.toISOString(),
      machine: await machine(database.url),
      settings: { seconds: SECONDS, warmupSeconds: WARMUP, pairs: PAIRS },
      http: rows,
      limits: [...limits.values()],
      wakeUp: wake,
      memory,
      streams,
      webhooks,
      transfer,
      neighbours,
      search: searching
    }, null, 2) + '\n')
    console.log(`\nwrote ${file}`)
  } finally {
    await service?.stop()
    await bouncer?.stop()
    await database.drop()
  }
}

main().catch((err: unknown) => {
  console.error(err)
  process.exit(1)
})
