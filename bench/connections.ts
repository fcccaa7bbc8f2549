/**
 * `npm run bench:connections` (issue #34): what N open event streams and long-polls cost the
 * server, for each N of CONNECTIONS_LIST (default 1000,5000,20000). Per N, on a fresh server on
 * a database made for the run, the connections are opened by separate load processes (this file
 * again, as BENCH_CONNECTIONS_ROLE=load: bench/connections-load.ts), half streams and half
 * long-polls, over max(min(N, 1,000), N/10) users with KEYS_PER_USER keys each; then:
 *
 * - the server's RSS (VmRSS) idle and with the N open, and the difference per connection;
 * - its event-loop lag, from its own /metrics (prom-client's monitorEventLoopDelay histogram,
 *   reset at each scrape, its 10 ms resolution taken off), idle and under the background, and
 *   as seen from here: the time GET /healthz takes, every 100 ms;
 * - wake-up: a 1:1 message to a random connected user, under a background of 200 sends/s to
 *   random connected users (other senders), timed as scenarios 4 and 10 do, from the send's 200
 *   (0 when the message arrived first) and from the start of the send: to the first of the
 *   user's connections to have it, and to the last;
 * - fan-out: one message to a group of 1,000 members (min(1,000, users)), every one connected,
 *   sent by one of them after the background stopped: the first delivery, the last member
 *   reached (by any of its connections) and the last connection, from the send's 200.
 *
 * Prints a markdown table and writes bench/results/<date>-connections.json. Delivery times are
 * taken in the load processes on CLOCK_MONOTONIC, the clock of this process's too.
 *
 * Environment: BENCH_DATABASE_URL (an admin URL, default postgres://postgres@127.0.0.1:5432/postgres),
 * CONNECTIONS_LIST, BENCH_POOL_SIZE (the service's DATABASE_POOL_SIZE, default 10, its default),
 * CONNECTIONS_PER_LOAD_PROCESS (10000), BENCH_NOFILE (the open-file limit to ask for, 65536),
 * PROFILE_DIR (the server runs under --cpu-prof, its profile written there when it stops).
 */
import { execFileSync, spawn, type ChildProcess } from 'node:child_process'
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs'
import { Agent, request } from 'node:http'
import { cpus, totalmem } from 'node:os'
import { join } from 'node:path'
import pg from 'pg'
import { connectPostgres } from '../src/db/client.js'
import { createGroupsRepository } from '../src/modules/groups/groups.repository.js'
import { createKeysRepository } from '../src/modules/keys/keys.repository.js'
import { createUsersRepository } from '../src/modules/users/users.repository.js'
import { monotonicMs, runLoad, type ConnectionSpec, type Delivery, type FromLoad, type LoadStats, type ToLoad } from './connections-load.js'
import { createFixtures, freshDatabase, ROOT, startService, type Key, type Service } from './fixtures.js'
import { percentiles, send, type Percentiles } from './pollers.js'

const ADMIN_URL = process.env.BENCH_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres'
const CONNECTIONS = (process.env.CONNECTIONS_LIST ?? '1000,5000,20000').split(',').map(Number)
if (CONNECTIONS.some((n) => !Number.isInteger(n) || n < 2)) throw new Error('CONNECTIONS_LIST must be a comma-separated list of integers of at least 2')
const POOL_SIZE = Number(process.env.BENCH_POOL_SIZE ?? 10)
const PER_LOAD_PROCESS = Number(process.env.CONNECTIONS_PER_LOAD_PROCESS ?? 10_000)
const NOFILE = Number(process.env.BENCH_NOFILE ?? 65_536)
const PROFILE_DIR = process.env.PROFILE_DIR
/** MAX_GROUP_MEMBERS's default: the fan-out's group, and the fewest users the connections are spread over. */
const GROUP = 1_000
const KEYS_PER_USER = 3
/** Connections per user, at most: users are max(min(N, GROUP), N / this). */
const PER_USER = 10
const BACKGROUND_PER_SECOND = 200
const BACKGROUND_SENDERS = 20
const WAKE_SAMPLES = 200
const WAKE_WORKERS = 4
const WAKE_BUDGET_MS = 45_000
const DELIVERY_TIMEOUT_MS = 5_000
const FANOUTS = 3
const OPEN_TIMEOUT_MS = 90_000
/** util-linux's, from PATH. */
const PRLIMIT = 'prlimit'
/** File descriptors a process needs beyond its connections (database pool, LISTEN, stdio, the event loop's own). */
const FD_MARGIN = 200

const settle = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

interface User { address: string, keys: Key[] }

function keyOf (address: string, created: { keyId: string, secret: string }): Key {
  return { address, keyId: created.keyId, secret: created.secret, authorization: `Basic ${Buffer.from(`${created.keyId}:${created.secret}`).toString('base64')}` }
}

/** Users with `keysPerUser` keys each, through the repositories (as fixtures.ts makes its own), 25 at a time. */
async function makeUsers (url: string, prefix: string, count: number, keysPerUser: number): Promise<User[]> {
  const database = await connectPostgres(url, 10)
  try {
    const users = createUsersRepository(database.db)
    const keys = createKeysRepository(database.db)
    const made: User[] = []
    for (let i = 0; i < count; i += 25) {
      made.push(...await Promise.all(Array.from({ length: Math.min(25, count - i) }, async (_, j) => {
        const address = `${prefix}${i + j}`
        await users.create({ address, displayName: null })
        const own: Key[] = []
        for (let k = 0; k < keysPerUser; k++) own.push(keyOf(address, await keys.create(address, 1_000_000_000)))
        return { address, keys: own }
      })))
    }
    return made
  } finally {
    await database.close()
  }
}

/** The users N connections are spread over: max(min(N, GROUP), N / PER_USER). */
const usersFor = (n: number) => Math.max(Math.min(n, GROUP), Math.ceil(n / PER_USER))

interface Connection { id: number, user: number, kind: 'sse' | 'poll', key: Key }

/**
 * Connection i is user i mod U's, round r = i div U; streams and long-polls alternate within a
 * user's connections (and between users when each has one), and its keys are taken in turn.
 */
function layout (n: number, users: User[]): Connection[] {
  const u = usersFor(n)
  return Array.from({ length: n }, (_, id) => {
    const user = id % u
    const round = Math.floor(id / u)
    return { id, user, kind: (id + round) % 2 === 0 ? 'sse' : 'poll', key: users[user]!.keys[round % KEYS_PER_USER]! }
  })
}

/** Each feed's last event id: a connection opened after it gets only what is sent from now on. */
async function lastEventIds (url: string, addresses: string[]): Promise<Map<string, number>> {
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  try {
    const { rows } = await client.query<{ address: string, seq: string }>('SELECT address, event_seq AS seq FROM users WHERE address = ANY($1)', [addresses])
    return new Map(rows.map((r) => [r.address, Number(r.seq)]))
  } finally {
    await client.end()
  }
}

/** The soft and hard open-file limits of a process. */
function fileLimit (pid: number | string): { soft: number, hard: number } {
  const line = /^Max open files\s+(\S+)\s+(\S+)/m.exec(readFileSync(`/proc/${pid}/limits`, 'utf8'))
  const value = (v: string | undefined) => v === 'unlimited' ? Infinity : Number(v)
  return { soft: value(line?.[1]), hard: value(line?.[2]) }
}

/**
 * Raises this process's open-file limit to BENCH_NOFILE (util-linux's prlimit on our own pid),
 * which the server and load processes inherit; Node raises its soft limit to the hard one when
 * it starts. Raising the hard limit needs CAP_SYS_RESOURCE: without it, the soft limit goes up
 * to the hard one, and the limit there is is what a phase is checked against.
 */
function raiseFileLimit (): { soft: number, hard: number, note: string } {
  const before = fileLimit(process.pid)
  let note = `raised to ${NOFILE}`
  try {
    execFileSync(PRLIMIT, ['--pid', String(process.pid), `--nofile=${NOFILE}:${NOFILE}`], { stdio: 'pipe' })
  } catch (err) {
    note = `could not be raised to ${NOFILE} (${(err as { stderr?: Buffer }).stderr?.toString().trim() ?? (err as Error).message}); kept at the hard limit`
    if (before.soft < before.hard) {
      try { execFileSync(PRLIMIT, ['--pid', String(process.pid), `--nofile=${before.hard}:${before.hard}`], { stdio: 'pipe' }) } catch {}
    }
  }
  return { ...fileLimit(process.pid), note }
}

function portRange (): { low: number, high: number } {
  const [low, high] = readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/).map(Number)
  return { low: low!, high: high! }
}

/** The service's /metrics, by series (name with its labels). */
async function scrape (url: string): Promise<Map<string, number>> {
  const text = await fetch(`${url}/metrics`).then((r) => r.text())
  const series = new Map<string, number>()
  for (const line of text.split('\n')) {
    if (line === '' || line.startsWith('#')) continue
    const space = line.lastIndexOf(' ')
    series.set(line.slice(0, space), Number(line.slice(space + 1)))
  }
  return series
}

interface Lag { p50: number, p99: number, max: number }

/** The server's event-loop lag since the last scrape, in ms (prom-client's histogram; its 10 ms resolution taken off). */
function serverLag (metrics: Map<string, number>): Lag {
  const ms = (name: string) => Math.max(0, (metrics.get(`nodejs_eventloop_lag_${name}_seconds`) ?? NaN) * 1000 - 10)
  return { p50: ms('p50'), p99: ms('p99'), max: ms('max') }
}

/** GET /healthz every 100 ms over one kept-alive connection, timed here; stopped, the times. */
function probeHealth (url: string): () => Promise<number[]> {
  const agent = new Agent({ keepAlive: true, maxSockets: 1 })
  const times: number[] = []
  let running = true
  const loop = (async () => {
    while (running) {
      const started = monotonicMs()
      await new Promise<void>((resolve) => {
        const req = request(`${url}/healthz`, { agent }, (res) => { res.resume().on('end', resolve) })
        req.on('error', () => resolve())
        req.end()
      })
      times.push(monotonicMs() - started)
      await settle(Math.max(0, 100 - (monotonicMs() - started)))
    }
  })()
  return async () => {
    running = false
    await loop
    agent.destroy()
    return times
  }
}

/** BACKGROUND_PER_SECOND sends, open loop, from the senders in turn to random recipients; stopped, what it did. */
function background (url: string, senders: Key[], recipients: string[]): () => Promise<{ sent: number, failed: number, skipped: number, seconds: number }> {
  let sent = 0
  let failed = 0
  let skipped = 0
  let started = 0
  let inFlight = 0
  const flights = new Set<Promise<void>>()
  const began = monotonicMs()
  const timer = setInterval(() => {
    const due = Math.floor((monotonicMs() - began) / 1000 * BACKGROUND_PER_SECOND)
    for (; started < due; started++) {
      // A server this far behind is not kept up with: the sends it could not take are counted.
      if (inFlight >= BACKGROUND_PER_SECOND) { skipped++; continue }
      inFlight++
      const recipient = recipients[Math.floor(Math.random() * recipients.length)]!
      const flight: Promise<void> = send(url, senders[started % senders.length]!, recipient, `bg:${started}`)
        .then(() => { sent++ }, () => { failed++ })
        .finally(() => { inFlight--; flights.delete(flight) })
      flights.add(flight)
    }
  }, 10)
  return async () => {
    clearInterval(timer)
    await Promise.all(flights)
    return { sent, failed, skipped, seconds: (monotonicMs() - began) / 1000 }
  }
}

/** A load process, and its answers. */
interface Loader {
  pid: number
  ask(message: ToLoad & { type: 'open' | 'stats' }): Promise<LoadStats>
  close(): Promise<void>
}

function startLoader (onDeliveries: (deliveries: Delivery[]) => void): Loader {
  const child: ChildProcess = spawn(process.execPath, ['--import', 'tsx', import.meta.filename], {
    cwd: ROOT,
    env: { ...process.env, BENCH_CONNECTIONS_ROLE: 'load' },
    stdio: ['ignore', 'inherit', 'inherit', 'ipc']
  })
  let waiting: { resolve: (stats: LoadStats) => void, reject: (err: Error) => void } | undefined
  child.on('message', (message: FromLoad) => {
    if (message.type === 'deliveries') return onDeliveries(message.deliveries)
    waiting?.resolve(message.stats)
    waiting = undefined
  })
  const exited = new Promise<void>((resolve) => child.once('exit', (code) => {
    waiting?.reject(new Error(`a load process exited with ${code}`))
    waiting = undefined
    resolve()
  }))
  return {
    pid: child.pid!,
    ask: (message) => new Promise((resolve, reject) => {
      waiting = { resolve, reject }
      child.send(message)
    }),
    close: async () => {
      if (child.exitCode !== null) return
      if (child.connected) child.send({ type: 'close' } satisfies ToLoad)
      const timer = setTimeout(() => child.kill('SIGKILL'), 10_000)
      await exited
      clearTimeout(timer)
    }
  }
}

/** Deliveries of tagged messages, awaited by tag. */
function deliveryBook () {
  const expected = new Map<string, { conns: Set<number>, got: Map<number, number>, complete: () => void }>()
  return {
    take (deliveries: Delivery[]): void {
      for (const d of deliveries) {
        const e = expected.get(d.tag)
        if (e === undefined || !e.conns.has(d.conn) || e.got.has(d.conn)) continue
        e.got.set(d.conn, d.at)
        if (e.got.size === e.conns.size) e.complete()
      }
    },
    /** Expects `tag` on every one of `conns`; `arrived` resolves when all have it, or after DELIVERY_TIMEOUT_MS. */
    expect (tag: string, conns: number[]): { got: Map<number, number>, arrived: () => Promise<void> } {
      let complete = () => {}
      const all = new Promise<void>((resolve) => { complete = resolve })
      const got = new Map<number, number>()
      expected.set(tag, { conns: new Set(conns), got, complete })
      return {
        got,
        arrived: async () => {
          let timer: NodeJS.Timeout | undefined
          await Promise.race([all, new Promise((resolve) => { timer = setTimeout(resolve, DELIVERY_TIMEOUT_MS) })])
          clearTimeout(timer)
          expected.delete(tag)
        }
      }
    }
  }
}

interface FanOut { recipients: number, connections: number, delivered: number, first: number, lastMember: number, lastConnection: number, lastConnectionFromStart: number }

interface PhaseResult {
  connections: number
  streams: number
  longPolls: number
  users: number
  keys: number
  loadProcesses: number
  established: { seconds: number, longPollsWaiting: number, openFds: number }
  rssIdle: number
  rssLoaded: number
  rssPeak: number
  rssPerConnection: number
  heapUsedIdle: number
  heapUsedLoaded: number
  /** libuv handles and resources by type with the connections open (Timeout: JS timers). */
  activeResources: Record<string, number>
  activeResourcesIdle: Record<string, number>
  lagIdle: Lag
  lagUnderLoad: Lag
  healthIdle: Percentiles
  healthUnderLoad: Percentiles
  background: { sent: number, failed: number, skipped: number, perSecond: number }
  wakeUp: {
    samples: number
    missed: number
    firstAfterSend: Percentiles
    firstFromSendStart: Percentiles
    allAfterSend: Percentiles
    sendDuration: Percentiles
  }
  fanOut: FanOut[]
  load: LoadStats[]
}

const resources = (metrics: Map<string, number>): Record<string, number> => Object.fromEntries(
  [...metrics].flatMap(([series, value]) => {
    const m = /^nodejs_active_(?:resources|handles)\{type="([^"]+)"\}$/.exec(series)
    return m === null ? [] : [[`${series.startsWith('nodejs_active_handles') ? 'handle' : 'resource'}:${m[1]}`, value]]
  }))

async function phase (n: number, databaseUrl: string, users: User[], senders: Key[]): Promise<PhaseResult> {
  const connections = layout(n, users)
  const connected = users.slice(0, usersFor(n))
  const byUser = new Map<number, number[]>()
  for (const c of connections) byUser.set(c.user, [...byUser.get(c.user) ?? [], c.id])

  // The fan-out's group: the first GROUP connected users (all of them when fewer), the first its sender.
  const members = connected.slice(0, GROUP)
  const database = await connectPostgres(databaseUrl, 2)
  const group = await createGroupsRepository(database.db).create(`fan-out ${n}`, members[0]!.address, members.map((m) => m.address)).finally(() => database.close())

  const service: Service = await startService(databaseUrl, {
    LOG_LEVEL: 'warn',
    RATE_LIMIT_PER_SECOND: '1000000',
    MAX_LONG_POLLS_PER_KEY: '10000',
    DATABASE_POOL_SIZE: String(POOL_SIZE)
  }, PROFILE_DIR === undefined ? [] : ['--cpu-prof', `--cpu-prof-dir=${PROFILE_DIR}`])
  const loaders: Loader[] = []
  let rssPeak = 0
  const sampler = setInterval(() => { rssPeak = Math.max(rssPeak, service.rss()) }, 1_000)
  try {
    const url = service.url
    const serverLimit = fileLimit(service.child.pid!)
    if (serverLimit.soft < n + FD_MARGIN) throw new Error(`the server's open-file limit is ${serverLimit.soft}, under the ${n + FD_MARGIN} ${n} connections need: raise the hard limit (BENCH_NOFILE, as a user with CAP_SYS_RESOURCE, or \`ulimit -Hn\`)`)

    // Warm: every route the phase uses once, so the idle RSS includes what the first requests load.
    for (let i = 0; i < 20; i++) await send(url, senders[i % senders.length]!, connected[i % connected.length]!.address, `warm:${i}`)
    await send(url, members[0]!.keys[0]!, group.id, 'warm group')
    await fetch(`${url}/v2/events?after=0`, { headers: { authorization: connected[0]!.keys[0]!.authorization } }).then((r) => r.arrayBuffer())
    await settle(2_000)
    const rssIdle = service.rss()
    const idleMetrics = await scrape(url)

    // Open: over as many load processes as PER_LOAD_PROCESS asks for, each with a share.
    const book = deliveryBook()
    const after = await lastEventIds(databaseUrl, connected.map((u) => u.address))
    const specs: ConnectionSpec[] = connections.map((c) => ({ id: c.id, kind: c.kind, authorization: c.key.authorization, after: after.get(users[c.user]!.address) ?? 0 }))
    const processes = Math.ceil(n / PER_LOAD_PROCESS)
    const openedAt = monotonicMs()
    for (let p = 0; p < processes; p++) loaders.push(startLoader((d) => book.take(d)))
    for (const loader of loaders) {
      const limit = fileLimit(loader.pid)
      if (limit.soft < Math.ceil(n / processes) + FD_MARGIN) throw new Error(`a load process's open-file limit is ${limit.soft}: lower CONNECTIONS_PER_LOAD_PROCESS`)
    }
    const share = Math.ceil(n / processes)
    await Promise.all(loaders.map((loader, p) => loader.ask({ type: 'open', url, connections: specs.slice(p * share, (p + 1) * share) })))
    // Established server-side: every long-poll waiting (a few may be between a read and a wait).
    const polls = connections.filter((c) => c.kind === 'poll').length
    let metrics = await scrape(url)
    while ((metrics.get('parley_long_polls_open') ?? 0) < polls * 0.99) {
      if (monotonicMs() - openedAt > OPEN_TIMEOUT_MS) throw new Error(`only ${metrics.get('parley_long_polls_open')} of ${polls} long-polls waiting after ${OPEN_TIMEOUT_MS / 1000} s`)
      await settle(500)
      metrics = await scrape(url)
    }
    const established = { seconds: (monotonicMs() - openedAt) / 1000, longPollsWaiting: metrics.get('parley_long_polls_open') ?? 0, openFds: metrics.get('process_open_fds') ?? NaN }
    console.log(`  ${n} connections established in ${established.seconds.toFixed(1)} s (${established.longPollsWaiting} long-polls waiting, ${established.openFds} fds open)`)

    // Idle, with the connections open.
    await settle(3_000)
    const stopIdleProbe = probeHealth(url)
    await settle(5_000)
    const healthIdle = percentiles(await stopIdleProbe())
    const loadedMetrics = await scrape(url)
    const rssLoaded = service.rss()
    const lagIdle = serverLag(loadedMetrics)

    // Under the background: wake-ups of random connected users.
    const stopBackground = background(url, senders.slice(WAKE_WORKERS), connected.map((u) => u.address))
    await settle(2_000)
    await scrape(url)
    const stopLoadProbe = probeHealth(url)
    const firstAfterSend: number[] = []
    const firstFromStart: number[] = []
    const allAfterSend: number[] = []
    const sendDuration: number[] = []
    let missed = 0
    let next = 0
    const deadline = monotonicMs() + WAKE_BUDGET_MS
    await Promise.all(senders.slice(0, WAKE_WORKERS).map(async (sender) => {
      while (next < WAKE_SAMPLES && monotonicMs() < deadline) {
        const i = next++
        const user = Math.floor(Math.random() * connected.length)
        const tag = `wake:${i}`
        const waiting = book.expect(tag, byUser.get(user)!)
        const started = monotonicMs()
        await send(url, sender, connected[user]!.address, tag)
        const ok = monotonicMs()
        await waiting.arrived()
        const times = [...waiting.got.values()]
        sendDuration.push(ok - started)
        if (times.length < byUser.get(user)!.length) missed++
        if (times.length === 0) continue
        firstAfterSend.push(Math.max(0, Math.min(...times) - ok))
        firstFromStart.push(Math.min(...times) - started)
        allAfterSend.push(Math.max(0, Math.max(...times) - ok))
        await settle(20 + Math.random() * 30)
      }
    }))
    const healthUnderLoad = percentiles(await stopLoadProbe())
    const lagUnderLoad = serverLag(await scrape(url))
    const bg = await stopBackground()

    // Fan-out, the background stopped: one group message, FANOUTS times.
    await settle(2_000)
    const fanOut: FanOut[] = []
    const recipients = members.slice(1)
    const recipientConns = recipients.flatMap((_, m) => byUser.get(m + 1)!)
    const memberOf = new Map(connections.map((c) => [c.id, c.user]))
    for (let f = 0; f < FANOUTS; f++) {
      const tag = `fan:${f}`
      const waiting = book.expect(tag, recipientConns)
      const started = monotonicMs()
      await send(url, members[0]!.keys[0]!, group.id, tag)
      const ok = monotonicMs()
      await waiting.arrived()
      const reached = new Map<number, number>()
      for (const [conn, at] of waiting.got) {
        const member = memberOf.get(conn)!
        reached.set(member, Math.min(reached.get(member) ?? Infinity, at))
      }
      const times = [...waiting.got.values()]
      fanOut.push({
        recipients: recipients.length,
        connections: recipientConns.length,
        delivered: times.length,
        first: Math.max(0, Math.min(...times) - ok),
        lastMember: reached.size === recipients.length ? Math.max(0, Math.max(...reached.values()) - ok) : NaN,
        lastConnection: times.length === recipientConns.length ? Math.max(0, Math.max(...times) - ok) : NaN,
        lastConnectionFromStart: times.length === recipientConns.length ? Math.max(...times) - started : NaN
      })
      await settle(2_000)
    }

    const load = await Promise.all(loaders.map((loader) => loader.ask({ type: 'stats' })))
    return {
      connections: n,
      streams: connections.length - polls,
      longPolls: polls,
      users: connected.length,
      keys: connected.length * KEYS_PER_USER,
      loadProcesses: processes,
      established,
      rssIdle,
      rssLoaded,
      rssPeak: Math.max(rssPeak, rssLoaded),
      rssPerConnection: (rssLoaded - rssIdle) / n,
      heapUsedIdle: idleMetrics.get('nodejs_heap_size_used_bytes') ?? NaN,
      heapUsedLoaded: loadedMetrics.get('nodejs_heap_size_used_bytes') ?? NaN,
      activeResourcesIdle: resources(idleMetrics),
      activeResources: resources(loadedMetrics),
      lagIdle,
      lagUnderLoad,
      healthIdle,
      healthUnderLoad,
      background: { sent: bg.sent, failed: bg.failed, skipped: bg.skipped, perSecond: bg.sent / bg.seconds },
      wakeUp: {
        samples: firstAfterSend.length,
        missed,
        firstAfterSend: percentiles(firstAfterSend),
        firstFromSendStart: percentiles(firstFromStart),
        allAfterSend: percentiles(allAfterSend),
        sendDuration: percentiles(sendDuration)
      },
      fanOut,
      load
    }
  } finally {
    clearInterval(sampler)
    await Promise.all(loaders.map((loader) => loader.close()))
    await service.stop()
  }
}

const ms = (n: number) => Number.isNaN(n) ? '–' : `${n.toFixed(1)} ms`
const mb = (n: number) => `${(n / 2 ** 20).toFixed(0)} MB`
const kib = (n: number) => `${(n / 1024).toFixed(1)} KiB`
const median = (values: number[]) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)] ?? NaN

function print (results: PhaseResult[], skipped: { connections: number, reason: string }[]): void {
  console.log('')
  console.log(`| N (streams + long-polls) | users × keys | server RSS idle → loaded (peak) | RSS per connection | heap used idle → loaded | timers per connection | server loop lag p50 / p99 / max, idle | under ${BACKGROUND_PER_SECOND} sends/s | GET /healthz p99 idle / under load |`)
  console.log('|---|---|---|---|---|---|---|---|---|')
  for (const r of results) {
    const timers = ((r.activeResources['resource:Timeout'] ?? 0) - (r.activeResourcesIdle['resource:Timeout'] ?? 0)) / r.connections
    console.log(`| ${r.connections} (${r.streams} + ${r.longPolls}) | ${r.users} × ${KEYS_PER_USER} | ${mb(r.rssIdle)} → ${mb(r.rssLoaded)} (${mb(r.rssPeak)}) | ${kib(r.rssPerConnection)} | ${mb(r.heapUsedIdle)} → ${mb(r.heapUsedLoaded)} | ${timers.toFixed(2)} | ` +
      `${ms(r.lagIdle.p50)} / ${ms(r.lagIdle.p99)} / ${ms(r.lagIdle.max)} | ${ms(r.lagUnderLoad.p50)} / ${ms(r.lagUnderLoad.p99)} / ${ms(r.lagUnderLoad.max)} | ${ms(r.healthIdle.p99)} / ${ms(r.healthUnderLoad.p99)} |`)
  }
  console.log('')
  console.log(`| N | wake-up p50 / p99, first connection, from the send's 200 | all the user's connections, p99 | from the send's start, p50 / p99 | send p99 | missed | background sends/s | fan-out to the group (median of ${FANOUTS}): first / last member / last connection | goals: RSS < 1.5 GB, wake p99 < 100 ms, fan-out last < 500 ms |`)
  console.log('|---|---|---|---|---|---|---|---|---|')
  for (const r of results) {
    const w = r.wakeUp
    const fan = (pick: (f: FanOut) => number) => ms(median(r.fanOut.map(pick)))
    const lastFan = median(r.fanOut.map((f) => f.lastConnection))
    const goals = [r.rssPeak < 1.5e9 ? 'RSS ok' : 'RSS over', w.firstAfterSend.p99 < 100 ? 'wake ok' : 'wake over', lastFan < 500 ? 'fan-out ok' : 'fan-out over'].join(', ')
    console.log(`| ${r.connections} | ${ms(w.firstAfterSend.p50)} / ${ms(w.firstAfterSend.p99)} | ${ms(w.allAfterSend.p99)} | ${ms(w.firstFromSendStart.p50)} / ${ms(w.firstFromSendStart.p99)} | ${ms(w.sendDuration.p99)} | ${w.missed} of ${w.samples} | ${r.background.perSecond.toFixed(0)} | ` +
      `${fan((f) => f.first)} / ${fan((f) => f.lastMember)} / ${fan((f) => f.lastConnection)} (${r.fanOut[0]?.recipients ?? 0} members, ${r.fanOut[0]?.connections ?? 0} connections) | ${goals} |`)
  }
  for (const s of skipped) console.log(`\nN = ${s.connections} skipped: ${s.reason}`)
}

async function main (): Promise<void> {
  const started = new Date()
  const files = raiseFileLimit()
  const ports = portRange()
  console.log(`open files: ${files.soft} (hard ${files.hard}), ${files.note}; loopback ephemeral ports ${ports.low}-${ports.high} (${ports.high - ports.low + 1})`)
  for (const n of CONNECTIONS) {
    // Every connection comes from 127.0.0.1 to one server port: one ephemeral port each.
    if (n + 1_000 > ports.high - ports.low + 1) console.warn(`warning: ${n} connections from one source address leave few of net.ipv4.ip_local_port_range's ports`)
  }
  const database = await freshDatabase(ADMIN_URL)
  try {
    process.stdout.write('setting up users and keys… ')
    await createFixtures(database.url, { pairs: 0, groups: 0, pollers: 0, idlers: 0 })
    const users = await makeUsers(database.url, 'conn', usersFor(Math.max(...CONNECTIONS)), KEYS_PER_USER)
    const senders = (await makeUsers(database.url, 'sender', WAKE_WORKERS + BACKGROUND_SENDERS, 1)).map((u) => u.keys[0]!)
    console.log('done')
    const results: PhaseResult[] = []
    const skipped: { connections: number, reason: string }[] = []
    for (const n of CONNECTIONS) {
      console.log(`N = ${n}: ${n / 2} event streams and ${n / 2} long-polls over ${usersFor(n)} users`)
      try {
        results.push(await phase(n, database.url, users, senders))
      } catch (err) {
        console.error(`  N = ${n} failed: ${(err as Error).message}`)
        skipped.push({ connections: n, reason: (err as Error).message })
      }
    }
    print(results, skipped)
    const client = new pg.Client({ connectionString: database.url })
    await client.connect()
    const { rows } = await client.query<{ version: string }>('SELECT version()')
    await client.end()
    const dir = join(ROOT, 'bench', 'results')
    mkdirSync(dir, { recursive: true })
    const file = join(dir, `${started.toISOString().slice(0, 10)}-connections.json`)
    writeFileSync(file, JSON.stringify({
      startedAt: started.toISOString(),
      machine: { cpu: cpus()[0]?.model ?? 'unknown', cores: cpus().length, memoryGiB: Math.round(totalmem() / 2 ** 30), node: process.version, postgres: rows[0]!.version, openFiles: files, ephemeralPorts: ports },
      settings: { poolSize: POOL_SIZE, keysPerUser: KEYS_PER_USER, backgroundPerSecond: BACKGROUND_PER_SECOND, wakeSamples: WAKE_SAMPLES, group: GROUP, perLoadProcess: PER_LOAD_PROCESS },
      results,
      skipped
    }, null, 2) + '\n')
    console.log(`\nwrote ${file}`)
  } finally {
    await database.drop()
  }
}

if (process.env.BENCH_CONNECTIONS_ROLE === 'load') {
  runLoad()
} else {
  main().catch((err: unknown) => {
    console.error(err)
    process.exit(1)
  })
}
