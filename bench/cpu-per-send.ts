/**
 * What a send costs in CPU (issue #15): the service from this checkout on the machine's
 * PostgreSQL, JSON sends and multipart sends with a 10 KiB image (scenarios 1 and 2) and sends
 * to a group of 20 (scenario 3; KINDS picks among json, multipart and group) at 10 and 50
 * connections (CONNECTIONS), ROUNDS (2) interleaved rounds of BENCH_SECONDS (8) each. For every
 * run it prints requests/s and latency, and the CPU time of the service's process and of every
 * PostgreSQL process over the run, from /proc, as a share of a core and per send: the figures
 * that say which side a change must shrink. Linux only. `npm run bench:cpu`.
 */
import { readdirSync, readFileSync } from 'node:fs'
import autocannon from 'autocannon'
import pg from 'pg'
import { createFixtures, freshDatabase, startService } from './fixtures.js'
import { jsonSend, multipartSend, type Request } from './sends.js'

const ADMIN_URL = process.env.BENCH_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres'
const SECONDS = Number(process.env.BENCH_SECONDS ?? 8)
const ROUNDS = Number(process.env.ROUNDS ?? 2)
const CONNECTIONS = (process.env.CONNECTIONS ?? '10,50').split(',').map(Number)
// KINDS: which sends, of json, multipart and group (to a group of 20).
const KINDS = (process.env.KINDS ?? 'json,multipart,group').split(',')
const CLOCK_TICKS = 100

/**
 * User plus system time of a process, in clock ticks (0 once it has exited); with `reaped`, also
 * that of the children it has waited for (cutime and cstime).
 */
function ticks (pid: number, reaped = false): number {
  try {
    const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ')
    return Number(fields[11]) + Number(fields[12]) + (reaped ? Number(fields[13]) + Number(fields[14]) : 0)
  } catch {
    return 0
  }
}

/**
 * Every PostgreSQL process's CPU time: the postmaster, its backends and its helpers, and those
 * that exited, which the postmaster reaped (an autovacuum worker, a backend the pool closed).
 * Counting only the living lost an exited process's time, and one that lived before the run and
 * exited during it took its earlier time off the run's: the PostgreSQL column read 5-52 % of a
 * core for the same send (2026-11-28).
 */
function postgresTicks (): number {
  let sum = 0
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue
    let comm = ''
    let parent = ''
    try {
      comm = readFileSync(`/proc/${entry}/comm`, 'utf8')
      parent = readFileSync(`/proc/${entry}/stat`, 'utf8').split(') ')[1]!.split(' ')[1]!
    } catch { continue }
    if (!comm.startsWith('postgres')) continue
    // The postmaster (its parent is not PostgreSQL) with what it reaped; each other process alone.
    const postmaster = !readFileSafe(`/proc/${parent}/comm`).startsWith('postgres')
    sum += ticks(Number(entry), postmaster)
  }
  return sum
}

function readFileSafe (path: string): string {
  try { return readFileSync(path, 'utf8') } catch { return '' }
}

/**
 * Before each measured run: a CHECKPOINT, then up to 10 s for autovacuum to finish, so a run is
 * not charged for the dirty pages and the vacuum the runs before it left (PostgreSQL's column
 * counts every PostgreSQL process; without this it swung between 20 and 100 % of a core for the
 * same send). Work a run causes while it runs still counts.
 */
async function settle (url: string): Promise<void> {
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  try {
    await client.query('CHECKPOINT')
    for (let waited = 0; waited < 10_000; waited += 250) {
      const { rows } = await client.query<{ n: number }>("SELECT count(*)::int AS n FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'")
      if (rows[0]!.n === 0) break
      await new Promise((resolve) => setTimeout(resolve, 250))
    }
  } finally {
    await client.end()
  }
}

const database = await freshDatabase(ADMIN_URL)
try {
  const f = await createFixtures(database.url, { pairs: Math.max(...CONNECTIONS), groups: Math.max(...CONNECTIONS), pollers: 0, idlers: 0 })
  // Statistics before the service starts, whatever its checkout: a fresh database has none until
  // autovacuum's first round, and a send planned without them reads every user (BENCHMARKS.md,
  // "a plan without statistics"). The service analyzes at start since then; checkouts from before
  // did not, and comparing the two needs both planned alike. Only tables that hold rows, as the
  // service's pass does: an empty table analyzed is planned as empty (reltuples 0, where a
  // never-analyzed one is taken for ten pages), and the foreign-key check of each attachment
  // on `messages` then kept a sequential scan for the connection's life, read every message
  // per file and doubled a multipart send's cost as the run went on (2026-11-28). Its own query,
  // not db/statistics.ts's analyzeStaleTables: the bench is copied into checkouts older than that.
  const analyzing = new pg.Client({ connectionString: database.url })
  await analyzing.connect()
  try {
    const { rows } = await analyzing.query<{ name: string }>(`SELECT format('%I.%I', n.nspname, c.relname) AS name
      FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
      WHERE n.nspname = current_schema() AND c.relkind = 'r' AND pg_relation_size(c.oid) > 0`)
    for (const { name } of rows) await analyzing.query(`ANALYZE ${name}`)
  } finally {
    await analyzing.end()
  }
  const service = await startService(database.url, { LOG_LEVEL: 'warn', RATE_LIMIT_PER_SECOND: '1000000' })
  const pid = service.child.pid!
  try {
    // Each kind: the request of the i-th connection.
    const kinds: [string, (i: number) => Request][] = [
      ['json', (i) => jsonSend(f.senders[i]!, f.receivers[i]!.address)],
      ['multipart', (i) => multipartSend(f.senders[i]!, f.receivers[i]!.address)],
      ['group', (i) => jsonSend(f.groups[i]!.sender, f.groups[i]!.id)]
    ]
    for (let round = 1; round <= ROUNDS; round++) {
      for (const [kind, sendOf] of kinds.filter(([k]) => KINDS.includes(k))) {
        for (const connections of CONNECTIONS) {
          const run = (duration: number) => {
            let client = 0
            return autocannon({
              url: `${service.url}/v2/message`,
              method: 'POST',
              connections,
              duration,
              setupClient: (c) => {
                const i = client++ % connections
                const send = sendOf(i)
                c.setHeadersAndBody(send.headers, send.body as string)
              }
            })
          }
          await run(2)
          await settle(database.url)
          const node0 = ticks(pid)
          const pg0 = postgresTicks()
          const started = performance.now()
          const result = await run(SECONDS)
          const seconds = (performance.now() - started) / 1000
          const node = (ticks(pid) - node0) / CLOCK_TICKS / seconds
          const pg = (postgresTicks() - pg0) / CLOCK_TICKS / seconds
          const rps = result.requests.average
          const perSend = (cores: number) => `${(cores * 100).toFixed(0).padStart(3)} % = ${(cores / rps * 1e6).toFixed(0).padStart(4)} µs a send`
          console.log(`round ${round}  ${kind.padEnd(9)} c=${String(connections).padEnd(2)} ${rps.toFixed(0).padStart(5)}/s  p50 ${result.latency.p50} ms  p99 ${result.latency.p99} ms  ` +
            `errors ${result.errors + result.timeouts + result.non2xx}  Node ${perSend(node)}  PostgreSQL ${perSend(pg)}`)
        }
      }
    }
  } finally {
    await service.stop()
  }
} finally {
  await database.drop()
}
