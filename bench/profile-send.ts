/**
 * Where a send's CPU goes (issue #15): `parley serve` under --cpu-prof while 50 connections
 * send 1:1 JSON messages (PROFILE_BODY=multipart: with a 10 KiB image) for BENCH_SECONDS (10),
 * each connection as its own sender. Prints
 * requests/s and the functions with the most self time; the .cpuprofile stays in PROFILE_DIR
 * (default /tmp/parley-profile) for Chrome's DevTools. `npm run bench:profile`.
 */
import { mkdirSync, readdirSync, readFileSync, rmSync } from 'node:fs'
import { join } from 'node:path'
import autocannon from 'autocannon'
import { createFixtures, freshDatabase, startService } from './fixtures.js'

const ADMIN_URL = process.env.BENCH_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres'
const SECONDS = Number(process.env.BENCH_SECONDS ?? 10)
const DIR = process.env.PROFILE_DIR ?? '/tmp/parley-profile'
const CONNECTIONS = 50
// PROFILE_BODY=multipart: sends with a 10 KiB image (scenario 2) instead of JSON.
const MULTIPART = process.env.PROFILE_BODY === 'multipart'
const IMAGE = Buffer.concat([Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]), Buffer.alloc(10 * 1024 - 8, 1)])

interface Profile {
  nodes: { id: number, callFrame: { functionName: string, url: string, lineNumber: number } }[]
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
        if (MULTIPART) {
          const boundary = 'parleyProfileBoundary'
          const field = (name: string, value: string) => `--${boundary}\r\nContent-Disposition: form-data; name="${name}"\r\n\r\n${value}\r\n`
          c.setHeadersAndBody({ authorization: f.senders[i]!.authorization, 'content-type': `multipart/form-data; boundary=${boundary}` }, Buffer.concat([
            Buffer.from(field('recipient', f.receivers[i]!.address) + field('body', 'a picture') +
              `--${boundary}\r\nContent-Disposition: form-data; name="attachment"; filename="p.png"\r\nContent-Type: image/png\r\n\r\n`),
            IMAGE, Buffer.from(`\r\n--${boundary}--\r\n`)
          ]) as unknown as string)
        } else {
          c.setHeadersAndBody({ authorization: f.senders[i]!.authorization, 'content-type': 'application/json' },
            JSON.stringify({ recipient: f.receivers[i]!.address, body: 'hello from the profiler' }))
        }
      }
    })
    console.log(`${result.requests.average} sends/s, p99 ${result.latency.p99} ms, non-2xx ${result.non2xx}`)
  } finally {
    await service.stop()
  }
  const file = readdirSync(DIR).find((name) => name.endsWith('.cpuprofile'))!
  const times = selfTimes(JSON.parse(readFileSync(join(DIR, file), 'utf8')) as Profile)
  const total = times.reduce((sum, [, ms]) => sum + ms, 0)
  console.log(`${join(DIR, file)}: ${total.toFixed(0)} ms sampled`)
  for (const [where, ms] of times.slice(0, 30)) console.log(`${ms.toFixed(0).padStart(7)} ms ${(100 * ms / total).toFixed(1).padStart(5)} %  ${where}`)
} finally {
  await database.drop()
}
