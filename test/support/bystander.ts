import { monitorEventLoopDelay } from 'node:perf_hooks'
import { setTimeout as sleep } from 'node:timers/promises'
import { sql } from 'drizzle-orm'
import pg from 'pg'
import type { TestContext } from '../helper.js'
import type { Db } from '../../src/db/client.js'
import { queryRows } from '../../src/db/rows.js'

/** The 99th percentile of latencies (ms). */
export const p99 = (values: number[]): number => [...values].sort((a, b) => a - b)[Math.ceil(values.length * 0.99) - 1] ?? 0

export interface Sent { status: number, ms: number }

/**
 * A bystander sending messages over real HTTP until stop(): each send to the next of
 * `recipients`, through the next of `bases` (several instances take turns), one at a time, at
 * most one per `everyMs`. Resolves with each answer's status and latency.
 */
export function sendLoop (bases: string[], authorization: string, recipients: string[], everyMs = 0) {
  const results: Sent[] = []
  let running = true
  const loop = (async () => {
    for (let i = 0; running; i++) {
      const started = performance.now()
      const res = await fetch(`${bases[i % bases.length]}/v2/message`, {
        method: 'POST',
        headers: { authorization, 'content-type': 'application/json' },
        body: JSON.stringify({ recipient: recipients[i % recipients.length], body: 'bystander' })
      })
      await res.arrayBuffer()
      results.push({ status: res.status, ms: performance.now() - started })
      const left = everyMs - (performance.now() - started)
      if (left > 0) await sleep(left)
    }
  })()
  return {
    async stop (): Promise<Sent[]> {
      running = false
      await loop
      return results
    }
  }
}

/** Several sendLoops at once, stopped together, their results in one list. */
export function sendLoops (loops: ReturnType<typeof sendLoop>[]) {
  return { stop: async (): Promise<Sent[]> => (await Promise.all(loops.map((l) => l.stop()))).flat() }
}

/**
 * The bound a bystander's p99 under load must stay under: `times` its p99 alone in the same
 * test, at least `floor` ms (a busy machine fails nothing), and never more than `ceiling` ms (a
 * real stall still fails).
 */
export function relativeBound (alone: number, ceiling: number, times = 5, floor = 250): number {
  return Math.min(ceiling, Math.max(times * alone, floor))
}

/**
 * Sends bob (or `recipient`) a message again and again until stop(); each answer's status and latency. With
 * everyMs, one send starts at most that often (to stay inside the default rate limit).
 */
export function bystander (base: string, authorization: string, everyMs = 0, recipient = 'bob') {
  const results: (Sent & { at: Date })[] = []
  let running = true
  let lastStart = 0
  const loop = (async () => {
    while (running) {
      const started = performance.now()
      if (everyMs > 0 && results.length > 0) await sleep(Math.max(0, everyMs - (started - lastStart)))
      lastStart = performance.now()
      const at = new Date()
      const res = await fetch(`${base}/v2/message`, {
        method: 'POST', headers: { authorization, 'content-type': 'application/json' }, body: JSON.stringify({ recipient, body: 'still here' })
      })
      await res.arrayBuffer()
      results.push({ status: res.status, ms: performance.now() - lastStart, at })
    }
  })()
  return {
    async stop () {
      running = false
      await loop
      return results
    }
  }
}

/** GET /v2/roster one at a time until `done` settles (or `count` times); each status and latency. */
export async function rosterReads (base: string, authorization: string, done: Promise<unknown> | number) {
  const results: { status: number, ms: number }[] = []
  let over = false
  if (typeof done !== 'number') void done.finally(() => { over = true })
  while (typeof done === 'number' ? results.length < done : !over) {
    const started = performance.now()
    const res = await fetch(`${base}/v2/roster`, { headers: { authorization } })
    await res.arrayBuffer()
    results.push({ status: res.status, ms: performance.now() - started })
    await sleep(20)
  }
  return results
}

/**
 * Where a bystander's time went, for a bound missed: the event loop's longest stall in this
 * process (the in-process server's), and the wait events of the database's busy backends,
 * sampled every 50 ms from a connection of its own. `report()` stops it (teardown does too).
 */
export async function watchStalls (t: TestContext, db: Db): Promise<{ report(): string }> {
  const loop = monitorEventLoopDelay({ resolution: 10 })
  loop.enable()
  const waits = new Map<string, number>()
  const [row] = await queryRows<{ name: string }>(db, sql`SELECT current_database() AS name`)
  const observer = new pg.Client({ connectionString: process.env.DATABASE_URL })
  await observer.connect()
  t.teardown(() => observer.end())
  const sampling = setInterval(() => {
    observer.query<{ w: string }>(`SELECT coalesce(wait_event_type || ':' || wait_event, 'cpu') AS w FROM pg_stat_activity
      WHERE datname = $1 AND state = 'active' AND pid <> pg_backend_pid()`, [row!.name]).then(
      ({ rows }) => { for (const { w } of rows) waits.set(w, (waits.get(w) ?? 0) + 1) }, () => {})
  }, 50)
  const stop = () => { clearInterval(sampling); loop.disable() }
  t.teardown(stop)
  return {
    report () {
      stop()
      return `longest event-loop stall ${(loop.max / 1e6).toFixed(0)} ms; backends seen waiting on ${JSON.stringify(Object.fromEntries(waits))}`
    }
  }
}
