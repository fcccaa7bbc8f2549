/**
 * What a send costs in CPU (issue #15): the service from this checkout on the machine's
 * PostgreSQL, JSON sends and multipart sends with a 10 KiB image (scenarios 1 and 2) at 10 and
 * 50 connections, ROUNDS (2) interleaved rounds of BENCH_SECONDS (8) each. For every run it
 * prints requests/s and latency, and the CPU time of the service's process and of every
 * PostgreSQL process over the run, from /proc, as a share of a core and per send: the figures
 * that say which side a change must shrink. Linux only. `npm run bench:cpu`.
 */
import { readdirSync, readFileSync } from 'node:fs'
import autocannon from 'autocannon'
import { createFixtures, freshDatabase, startService, type Key } from './fixtures.js'
import { jsonSend, multipartSend, type Request } from './sends.js'

const ADMIN_URL = process.env.BENCH_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres'
const SECONDS = Number(process.env.BENCH_SECONDS ?? 8)
const ROUNDS = Number(process.env.ROUNDS ?? 2)
const CONNECTIONS = [10, 50]
const CLOCK_TICKS = 100

/** User plus system time of a process, in clock ticks (0 once it has exited). */
function ticks (pid: number): number {
  try {
    const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ')
    return Number(fields[11]) + Number(fields[12])
  } catch {
    return 0
  }
}

/** Every PostgreSQL process's CPU time: the postmaster, its backends and its helpers. */
function postgresTicks (): number {
  let sum = 0
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue
    let comm = ''
    try { comm = readFileSync(`/proc/${entry}/comm`, 'utf8') } catch { continue }
    if (comm.startsWith('postgres')) sum += ticks(Number(entry))
  }
  return sum
}

const database = await freshDatabase(ADMIN_URL)
try {
  const f = await createFixtures(database.url, { pairs: Math.max(...CONNECTIONS), groups: 0, pollers: 0, idlers: 0 })
  const service = await startService(database.url, { LOG_LEVEL: 'warn', RATE_LIMIT_PER_SECOND: '1000000' })
  const pid = service.child.pid!
  try {
    const kinds: [string, (from: Key, recipient: string) => Request][] = [['json', jsonSend], ['multipart', multipartSend]]
    for (let round = 1; round <= ROUNDS; round++) {
      for (const [kind, sendOf] of kinds) {
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
                const send = sendOf(f.senders[i]!, f.receivers[i]!.address)
                c.setHeadersAndBody(send.headers, send.body as string)
              }
            })
          }
          await run(2)
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
