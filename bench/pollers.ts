import { Agent, request } from 'node:http'
import pg from 'pg'
import type { Key } from './fixtures.js'

export interface Percentiles { p50: number, p90: number, p99: number, max: number }

export function percentiles (values: number[]): Percentiles {
  const sorted = [...values].sort((a, b) => a - b)
  const at = (q: number) => sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] ?? NaN
  return { p50: at(0.5), p90: at(0.9), p99: at(0.99), max: sorted[sorted.length - 1] ?? NaN }
}

interface Poll { answered: Promise<number>, abort: () => void }

/** One long-poll on its own connection; resolves with the time (ms, performance clock) it was answered. */
function poll (agent: Agent, url: string, key: Key, waitSeconds: number): Poll {
  let req: ReturnType<typeof request> | undefined
  const answered = new Promise<number>((resolve, reject) => {
    req = request(`${url}/v2/events?after=0&wait=${waitSeconds}`, { agent, headers: { authorization: key.authorization } }, (res) => {
      res.resume()
      res.on('end', () => res.statusCode === 200 ? resolve(performance.now()) : reject(new Error(`poll answered ${res.statusCode}`)))
    })
    req.on('error', reject)
    req.end()
  })
  answered.catch(() => {})
  return { answered, abort: () => req?.destroy() }
}

export async function send (url: string, from: Key, to: string, body: string): Promise<void> {
  const res = await fetch(`${url}/v2/message`, {
    method: 'POST',
    headers: { authorization: from.authorization, 'content-type': 'application/json' },
    body: JSON.stringify({ recipient: to, body })
  })
  if (res.status !== 200) throw new Error(`send answered ${res.status}: ${await res.text()}`)
  await res.arrayBuffer()
}

async function listeners (databaseUrl: string): Promise<number> {
  const client = new pg.Client({ connectionString: databaseUrl })
  await client.connect()
  try {
    const name = new URL(databaseUrl).pathname.slice(1)
    const { rows } = await client.query<{ n: number }>(
      "SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = $1 AND application_name LIKE 'parley listener %'", [name])
    return rows[0]!.n
  } finally {
    await client.end()
  }
}

const settle = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

export interface WakeResult {
  pollers: number
  /** From the send's 200 reaching its sender to the poller's answer (0 when the poll answered first). */
  afterSend: Percentiles
  /** From the start of the send request to the poller's answer. */
  fromSendStart: Percentiles
  listenConnections: number
}

/**
 * Sends each listener one message (20 sends at a time, from the senders in turn) and times
 * `arrived(i)`, when listener i had it, against its send: from the send's 200 (0 when it
 * arrived first) and from the send's start.
 */
export async function timeWakeUps (url: string, listeners: Key[], senders: Key[], arrived: (i: number) => Promise<number>): Promise<{ afterSend: Percentiles, fromSendStart: Percentiles }> {
  const afterSend: number[] = []
  const fromStart: number[] = []
  let next = 0
  await Promise.all(Array.from({ length: 20 }, async () => {
    while (next < listeners.length) {
      const i = next++
      const started = performance.now()
      await send(url, senders[i % senders.length]!, listeners[i]!.address, `wake ${i}`)
      const ok = performance.now()
      const at = await arrived(i)
      afterSend.push(Math.max(0, at - ok))
      fromStart.push(at - started)
    }
  }))
  return { afterSend: percentiles(afterSend), fromSendStart: percentiles(fromStart) }
}

/**
 * Scenario 4: every poller waits on its own feed; then each gets one message (20 sends at a
 * time, from the senders in turn), and each poller's answer is timed against its send.
 */
export async function wakeUpLatency (url: string, databaseUrl: string, pollers: Key[], senders: Key[]): Promise<WakeResult> {
  const agent = new Agent({ keepAlive: true, maxSockets: Infinity })
  const polls = pollers.map((p) => poll(agent, url, p, 30))
  await settle(3_000)
  const listenConnections = await listeners(databaseUrl)
  const { afterSend, fromSendStart } = await timeWakeUps(url, pollers, senders, (i) => polls[i]!.answered)
  agent.destroy()
  return { pollers: pollers.length, afterSend, fromSendStart, listenConnections }
}

export interface MemoryResult { idlePolls: number, rssBefore: number, rssWithPolls: number, perPoll: number }

/** Scenario 6: the server's RSS with this many idle long-polls open. */
export async function idlePollMemory (url: string, idlers: Key[], perKey: number, rss: () => number): Promise<MemoryResult> {
  const rssBefore = rss()
  const agent = new Agent({ keepAlive: true, maxSockets: Infinity })
  const polls: Poll[] = []
  for (const key of idlers) {
    for (let i = 0; i < perKey; i++) polls.push(poll(agent, url, key, 30))
    if (polls.length % 500 === 0) await settle(50)
  }
  await settle(5_000)
  const open = await fetch(`${url}/metrics`).then((r) => r.text())
  const waiting = Number(/^parley_long_polls_open (\d+)/m.exec(open)?.[1] ?? NaN)
  const rssWithPolls = rss()
  for (const p of polls) p.abort()
  agent.destroy()
  return { idlePolls: waiting, rssBefore, rssWithPolls, perPoll: (rssWithPolls - rssBefore) / Math.max(1, waiting) }
}
