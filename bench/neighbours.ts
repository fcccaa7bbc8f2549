/**
 * Scenario 7, noisy neighbours: one key sends messages one after another (the bystander) while
 * another key abuses an expensive route as hard as its rate limit allows. Reports the
 * bystander's latency alone and under each abuse, and what the abuser got. See BENCHMARKS.md.
 */
import { randomBytes } from 'node:crypto'
import pg from 'pg'
import type { Key } from './fixtures.js'

export interface NeighbourRow {
  abuse: string
  bystander: { sends: number, p50: number, p99: number, max: number, non200: number }
  abuser: { requests: number, statuses: Record<string, number> }
}

const percentile = (sorted: number[], p: number): number => sorted[Math.min(sorted.length - 1, Math.ceil(sorted.length * p) - 1)] ?? 0

interface Abuse { name: string, concurrency: number, request: () => Promise<number> }

/** Runs `abuse` with its concurrency for `seconds` while the bystander sends; both sides' outcomes. */
async function measure (url: string, bystander: Key, recipient: string, seconds: number, abuse?: Abuse): Promise<NeighbourRow> {
  let running = true
  const statuses: Record<string, number> = {}
  let requests = 0
  const workers = abuse === undefined
    ? []
    : Array.from({ length: abuse.concurrency }, async () => {
      while (running) {
        const status = await abuse.request().catch(() => 0)
        statuses[status] = (statuses[status] ?? 0) + 1
        requests++
      }
    })
  // Let the abuse build up before measuring.
  if (abuse !== undefined) await new Promise((resolve) => setTimeout(resolve, 1_000))
  const latencies: number[] = []
  let non200 = 0
  const until = Date.now() + seconds * 1000
  while (Date.now() < until) {
    const started = performance.now()
    const res = await fetch(`${url}/v2/message`, {
      method: 'POST',
      headers: { authorization: bystander.authorization, 'content-type': 'application/json' },
      body: JSON.stringify({ recipient, body: 'still here' })
    })
    await res.arrayBuffer()
    latencies.push(performance.now() - started)
    if (res.status !== 200) non200++
  }
  running = false
  await Promise.all(workers)
  latencies.sort((a, b) => a - b)
  return {
    abuse: abuse === undefined ? 'none (alone)' : abuse.name,
    bystander: { sends: latencies.length, p50: percentile(latencies, 0.5), p99: percentile(latencies, 0.99), max: latencies.at(-1) ?? 0, non200 },
    abuser: { requests, statuses }
  }
}

async function status (res: Response): Promise<number> {
  await res.arrayBuffer()
  return res.status
}

/** Every abuse of issue #12, each for `seconds`, against a running service. */
export async function noisyNeighbours (url: string, databaseUrl: string, bystander: Key, recipient: string, abuser: Key, seconds: number): Promise<NeighbourRow[]> {
  const post = (path: string, key: Key, body: unknown) => fetch(`${url}${path}`, {
    method: 'POST', headers: { authorization: key.authorization, 'content-type': 'application/json' }, body: JSON.stringify(body)
  })

  // 999 users for the big groups, and a 25 MiB attachment for the downloads.
  const client = new pg.Client({ connectionString: databaseUrl })
  await client.connect()
  await client.query("INSERT INTO users (address) SELECT 'crowd' || g FROM generate_series(1, 999) g ON CONFLICT DO NOTHING")
  await client.end()
  const crowd = Array.from({ length: 999 }, (_, i) => `crowd${i + 1}`)
  const file = new Blob([new Uint8Array(randomBytes(25 * 1024 * 1024))], { type: 'application/octet-stream' })
  const upload = () => {
    const form = new FormData()
    form.append('recipient', recipient)
    for (let i = 0; i < 2; i++) form.append('attachment', file, `big${i}.bin`)
    return form
  }
  const sent = await fetch(`${url}/v2/message`, { method: 'POST', headers: { authorization: abuser.authorization }, body: upload() })
  const { id } = await sent.json() as { id: string }
  const wide = JSON.stringify({ recipient, body: 'x', extra: Array.from({ length: 200_000 }, (_, i) => i) })
  const bogus = () => `Basic ${Buffer.from(`key_${randomBytes(20).toString('hex').slice(0, 26)}:sk_guess`).toString('base64')}`

  const abuses: Abuse[] = [
    { name: 'uploads: 12 at once, 2 x 25 MiB each', concurrency: 12, request: async () => status(await fetch(`${url}/v2/message`, { method: 'POST', headers: { authorization: abuser.authorization }, body: upload() })) },
    { name: 'downloads: 30 at once, 25 MiB each', concurrency: 30, request: async () => status(await fetch(`${url}/v2/message/${id}/attachment/1`, { headers: { authorization: abuser.authorization } })) },
    { name: 'big groups: 20 creates at once, 1,000 members each', concurrency: 20, request: async () => status(await post('/v2/group', abuser, { name: 'crowd', members: crowd })) },
    { name: 'search flood: 40 at once, query "a"', concurrency: 40, request: async () => status(await post('/v2/search', abuser, { query: 'a', limit: 200 })) },
    { name: 'wide bodies: 10 at once, 1 MiB of 200,000 numbers', concurrency: 10, request: async () => status(await fetch(`${url}/v2/message`, { method: 'POST', headers: { authorization: abuser.authorization, 'content-type': 'application/json' }, body: wide })) },
    { name: 'bogus keys: 50 at once, made-up key ids', concurrency: 50, request: async () => status(await fetch(`${url}/v2/whoami`, { headers: { authorization: bogus() } })) }
  ]
  const rows = [await measure(url, bystander, recipient, seconds)]
  for (const abuse of abuses) {
    console.log(`scenario 7: noisy neighbour, ${abuse.name}`)
    rows.push(await measure(url, bystander, recipient, seconds, abuse))
  }
  return rows
}
