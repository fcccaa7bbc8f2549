/**
 * Where a send's CPU goes (issue #15): `parley serve` under --cpu-prof while 50 connections
 * send 1:1 JSON messages (PROFILE_BODY=multipart: with a 10 KiB image) for BENCH_SECONDS (10),
 * each connection as its own sender. Prints
 * requests/s, the share of time spent under each of a few packages (a sample counts for every
 * package on its stack), and the functions with the most self time; the .cpuprofile stays in PROFILE_DIR
 * (default /tmp/parley-profile) for Chrome's DevTools. `npm run bench:profile`.
 */
import { mkdirSync, readdirSync, readFileSync, rmSync } from 'node:fs'
import { join } from 'node:path'
import autocannon from 'autocannon'
import { createFixtures, freshDatabase, startService } from './fixtures.js'
import { jsonSend, multipartSend } from './sends.js'

const ADMIN_URL = process.env.BENCH_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres'
const SECONDS = Number(process.env.BENCH_SECONDS ?? 10)
const DIR = process.env.PROFILE_DIR ?? '/tmp/parley-profile'
const CONNECTIONS = 50
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
    console.log(`${result.requests.average} sends/s, p99 ${result.latency.p99} ms, non-2xx ${result.non2xx}`)
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
