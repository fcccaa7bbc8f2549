/**
 * Where a send's CPU and time go (issues #15, #34): `parley serve` under --cpu-prof while
 * PROFILE_CONNECTIONS (50) connections send 1:1 JSON messages (PROFILE_BODY=multipart: with a
 * 10 KiB image) for BENCH_SECONDS (10), each connection as its own sender. Prints requests/s;
 * where a send waited, stage by stage, from the server's parley_send_stage_seconds histograms
 * (its wait in the lane for a batch, its batch's statement, the mean batch, and the rest of the
 * request); the share of CPU time under each of a few packages (a sample counts for every
 * package on its stack), and the functions with the most self time. The .cpuprofile stays in
 * PROFILE_DIR (default /tmp/parley-profile) for Chrome's DevTools. `npm run bench:profile`.
 */
import { mkdirSync, readdirSync, readFileSync, rmSync } from 'node:fs'
import { join } from 'node:path'
import autocannon from 'autocannon'
import { createFixtures, freshDatabase, startService } from './fixtures.js'
import { jsonSend, multipartSend } from './sends.js'

const ADMIN_URL = process.env.BENCH_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres'
const SECONDS = Number(process.env.BENCH_SECONDS ?? 10)
const DIR = process.env.PROFILE_DIR ?? '/tmp/parley-profile'
const CONNECTIONS = Number(process.env.PROFILE_CONNECTIONS ?? 50)
// PROFILE_BODY=multipart: sends with a 10 KiB image (scenario 2) instead of JSON.
const MULTIPART = process.env.PROFILE_BODY === 'multipart'

interface Profile {
  nodes: { id: number, callFrame: { functionName: string, url: string, lineNumber: number }, children?: number[] }[]
  samples: number[]
  timeDeltas: number[]
}

/** Self time per function, in ms, most first. */
function selfTimes (profile: Profile): [string, number][] {
  const nodes = new Map(profile.nodes.map((n) => [n.id, n]))
  const self = new Map<string, number>()
  profile.samples.forEach((id, i) => {
    const frame = nodes.get(id)!.callFrame
    const where = `${frame.functionName || '(anonymous)'} ${frame.url.split('/').slice(-3).join('/')}:${frame.lineNumber + 1}`
    self.set(where, (self.get(where) ?? 0) + profile.timeDeltas[i]! / 1000)
  })
  return [...self].sort((a, b) => b[1] - a[1])
}

/** A metric's samples from the text exposition: labels as written, and the value. */
function samples (text: string, name: string): { labels: string, value: number }[] {
  const out: { labels: string, value: number }[] = []
  for (const line of text.split('\n')) {
    const m = /^(\w+)(\{[^}]*\})? (\S+)$/.exec(line)
    if (m !== null && m[1] === name) out.push({ labels: m[2] ?? '', value: Number(m[3]) })
  }
  return out
}

/** A quantile of a histogram's buckets (cumulative counts by upper bound), linear within its bucket. */
function quantile (buckets: { le: number, count: number }[], q: number): number {
  const total = buckets.at(-1)!.count
  let below = 0
  let lower = 0
  for (const { le, count } of buckets) {
    if (count >= q * total) return le === Infinity ? lower : lower + (le - lower) * (q * total - below) / Math.max(1, count - below)
    below = count
    lower = le
  }
  return lower
}

/** Where the server's sends waited, by stage, from its /metrics (parley_send_stage_seconds). */
function stageReport (text: string): string[] {
  const lines: string[] = []
  const ms = (seconds: number): string => (seconds * 1000).toFixed(2).padStart(7)
  for (const stage of ['queued', 'statement']) {
    const buckets = samples(text, 'parley_send_stage_seconds_bucket')
      .filter((s) => s.labels.includes(`stage="${stage}"`))
      .map((s) => ({ le: Number(/le="([^"]+)"/.exec(s.labels)![1]!.replace('+Inf', 'Infinity')), count: s.value }))
      .sort((a, b) => a.le - b.le)
    const count = samples(text, 'parley_send_stage_seconds_count').find((s) => s.labels.includes(`stage="${stage}"`))?.value ?? 0
    const sum = samples(text, 'parley_send_stage_seconds_sum').find((s) => s.labels.includes(`stage="${stage}"`))?.value ?? 0
    if (count === 0) continue
    lines.push(`${stage.padEnd(10)} n ${String(count).padStart(7)}  mean ${ms(sum / count)} ms  p50 ${ms(quantile(buckets, 0.5))}  p90 ${ms(quantile(buckets, 0.9))}  p99 ${ms(quantile(buckets, 0.99))}`)
  }
  const batches = samples(text, 'parley_send_batches_total')[0]?.value ?? 0
  const batched = samples(text, 'parley_send_batched_total')[0]?.value ?? 0
  if (batches > 0) lines.push(`mean batch ${(batched / batches).toFixed(2)} sends (${batches} statements)`)
  const route = (s: { labels: string }): boolean => s.labels.includes('method="POST"') && s.labels.includes('route="/v2/message"')
  const count = samples(text, 'parley_http_request_duration_seconds_count').find(route)?.value ?? 0
  const sum = samples(text, 'parley_http_request_duration_seconds_sum').find(route)?.value ?? 0
  if (count > 0) lines.push(`request   n ${String(count).padStart(7)}  mean ${ms(sum / count)} ms (from its first byte read to its answer written, every stage)`)
  return lines
}

/** Where whole layers of a send sit, by the files their frames come from. */
const LAYERS: [string, RegExp][] = [
  ['the multipart parser (@fastify/multipart, busboy) and what it calls', /@fastify\/multipart|@fastify\/busboy/],
  ['pg and pg-protocol', /node_modules\/pg(-protocol)?\//],
  ['drizzle-orm', /drizzle-orm/],
  ['fastify and its plugins', /node_modules\/(fastify|@fastify)\//],
  ['hashing', /internal\/crypto\/hash/]
]

/** Time with a frame of each layer anywhere on the stack, in ms (a sample can count for several). */
function inclusiveTimes (profile: Profile): [string, number][] {
  const nodes = new Map(profile.nodes.map((n) => [n.id, n]))
  const parent = new Map<number, number>()
  for (const n of profile.nodes) for (const child of n.children ?? []) parent.set(child, n.id)
  const times = new Map<string, number>(LAYERS.map(([name]) => [name, 0]))
  profile.samples.forEach((id, i) => {
    const layers = new Set<string>()
    for (let at: number | undefined = id; at !== undefined; at = parent.get(at)) {
      const url = nodes.get(at)!.callFrame.url
      for (const [name, files] of LAYERS) if (files.test(url)) layers.add(name)
    }
    for (const name of layers) times.set(name, times.get(name)! + profile.timeDeltas[i]! / 1000)
  })
  return [...times]
}

const database = await freshDatabase(ADMIN_URL)
try {
  const f = await createFixtures(database.url, { pairs: CONNECTIONS, groups: 0, pollers: 0, idlers: 0 })
  rmSync(DIR, { recursive: true, force: true })
  mkdirSync(DIR, { recursive: true })
  const service = await startService(database.url, { LOG_LEVEL: 'warn', RATE_LIMIT_PER_SECOND: '1000000' }, ['--cpu-prof', `--cpu-prof-dir=${DIR}`])
  let client = 0
  try {
    const result = await autocannon({
      url: `${service.url}/v2/message`,
      method: 'POST',
      connections: CONNECTIONS,
      duration: SECONDS,
      setupClient: (c) => {
        const i = client++ % CONNECTIONS
        const send = (MULTIPART ? multipartSend : jsonSend)(f.senders[i]!, f.receivers[i]!.address)
        c.setHeadersAndBody(send.headers, send.body as string)
      }
    })
    console.log(`${result.requests.average} sends/s, p50 ${result.latency.p50} ms, p99 ${result.latency.p99} ms, non-2xx ${result.non2xx}`)
    const metrics = await fetch(`${service.url}/metrics`)
    if (!metrics.ok) throw new Error(`GET /metrics answered ${metrics.status}`)
    for (const line of stageReport(await metrics.text())) console.log(line)
  } finally {
    await service.stop()
  }
  const file = readdirSync(DIR).find((name) => name.endsWith('.cpuprofile'))!
  const profile = JSON.parse(readFileSync(join(DIR, file), 'utf8')) as Profile
  const times = selfTimes(profile)
  const total = times.reduce((sum, [, ms]) => sum + ms, 0)
  console.log(`${join(DIR, file)}: ${total.toFixed(0)} ms sampled`)
  for (const [layer, ms] of inclusiveTimes(profile)) console.log(`${ms.toFixed(0).padStart(7)} ms ${(100 * ms / total).toFixed(1).padStart(5)} %  under ${layer}`)
  for (const [where, ms] of times.slice(0, 30)) console.log(`${ms.toFixed(0).padStart(7)} ms ${(100 * ms / total).toFixed(1).padStart(5)} %  ${where}`)
} finally {
  await database.drop()
}
