import { once } from 'node:events'
import { Agent, createServer, request } from 'node:http'
import type { AddressInfo } from 'node:net'
import pg from 'pg'
import type { Key } from './fixtures.js'
import { percentiles, send, timeWakeUps, type Percentiles } from './pollers.js'

interface Stream { firstEvent: Promise<number>, close: () => void }

/** One event stream on its own connection; resolves with when (performance clock) its first event arrived. */
function openStream (agent: Agent, url: string, key: Key): Stream {
  let req: ReturnType<typeof request> | undefined
  const firstEvent = new Promise<number>((resolve, reject) => {
    req = request(`${url}/v2/events/stream`, { agent, headers: { authorization: key.authorization, accept: 'text/event-stream' } }, (res) => {
      if (res.statusCode !== 200) reject(new Error(`stream answered ${res.statusCode}`))
      let text = ''
      res.setEncoding('utf8').on('data', (chunk: string) => {
        text += chunk
        if (/^id: /m.test(text)) resolve(performance.now())
      })
    })
    req.on('error', reject)
    req.end()
  })
  firstEvent.catch(() => {})
  return { firstEvent, close: () => req?.destroy() }
}

export interface StreamWakeResult { streams: number, afterSend: Percentiles, fromSendStart: Percentiles }

/**
 * Scenario 10: one event stream open per user, 1,000 of them; then each user gets one message
 * (20 sends at a time), and the event's arrival on its stream is timed against its send.
 */
export async function streamWakeUp (url: string, listeners: Key[], senders: Key[]): Promise<StreamWakeResult> {
  // Empty feeds first: a stream begins with the events a feed still holds.
  for (let i = 0; i < listeners.length; i += 50) {
    await Promise.all(listeners.slice(i, i + 50).map((k) => fetch(`${url}/v2/events`, { method: 'DELETE', headers: { authorization: k.authorization } }).then((r) => r.arrayBuffer())))
  }
  const agent = new Agent({ keepAlive: true, maxSockets: Infinity })
  const streams = listeners.map((k) => openStream(agent, url, k))
  await new Promise((resolve) => setTimeout(resolve, 3_000))
  const { afterSend, fromSendStart } = await timeWakeUps(url, listeners, senders, (i) => streams[i]!.firstEvent)
  for (const s of streams) s.close()
  agent.destroy()
  return { streams: listeners.length, afterSend, fromSendStart }
}

export interface WebhookResult {
  webhooks: number
  events: number
  /** Live: events delivered per second, from the first send to the last delivery. */
  eventsPerSecond: number
  /** Live: from a send's 200 to its event's arrival at the receiver. */
  latency: Percentiles
  /** A backlog of `events` already in the feeds: delivered per second, first arrival to last. */
  backlogEventsPerSecond: number
}

/**
 * Scenario 11: `owners` each register a webhook to one receiver on loopback, then `perOwner`
 * messages are sent to each (one connection per sender) and every delivery is counted; the webhooks are
 * deleted after, so later scenarios send to nobody's webhook.
 */
export async function webhookThroughput (url: string, databaseUrl: string, owners: Key[], senders: Key[], perOwner: number): Promise<WebhookResult> {
  const arrivals = new Map<string, number>()
  let received = 0
  let allArrived: () => void = () => {}
  const done = new Promise<void>((resolve) => { allArrived = resolve })
  const total = owners.length * perOwner
  const receiver = createServer((req, res) => {
    let body = ''
    req.setEncoding('utf8').on('data', (chunk: string) => { body += chunk }).on('end', () => {
      const event = JSON.parse(body) as { data: { message: { body: string } } }
      arrivals.set(event.data.message.body, performance.now())
      res.writeHead(204).end()
      if (++received >= total) allArrived()
    })
  })
  receiver.listen(0, '127.0.0.1')
  await once(receiver, 'listening')
  const hookUrl = `http://127.0.0.1:${(receiver.address() as AddressInfo).port}/hook`
  const hooks: { owner: Key, id: string }[] = []
  for (const owner of owners) {
    const res = await fetch(`${url}/v2/webhooks`, {
      method: 'POST', headers: { authorization: owner.authorization, 'content-type': 'application/json' }, body: JSON.stringify({ url: hookUrl, events: ['message.received'] })
    })
    if (res.status !== 200) throw new Error(`webhook answered ${res.status}: ${await res.text()}`)
    hooks.push({ owner, id: ((await res.json()) as { id: string }).id })
  }
  const sentAt = new Map<string, number>()
  const started = performance.now()
  let next = 0
  // Each connection sends as its own key: one key's sends are admitted a few at a time.
  await Promise.all(senders.map(async (sender) => {
    while (next < total) {
      const i = next++
      const body = `hook ${i}`
      await send(url, sender, owners[i % owners.length]!.address, body)
      sentAt.set(body, performance.now())
    }
  }))
  await Promise.race([done, new Promise((resolve) => setTimeout(resolve, 120_000))])
  const finished = Math.max(...arrivals.values())
  const latency = [...sentAt].map(([body, at]) => Math.max(0, (arrivals.get(body) ?? Infinity) - at))
  const live = { events: arrivals.size, eventsPerSecond: arrivals.size / ((finished - started) / 1000) }

  // The backlog: the same events again, as if each webhook had been made before them.
  arrivals.clear()
  received = 0
  const drained = new Promise<void>((resolve) => { allArrived = resolve })
  const client = new pg.Client({ connectionString: databaseUrl })
  await client.connect()
  await client.query('UPDATE webhooks SET delivered_through = 0, next_attempt_at = now() WHERE id = ANY($1)', [hooks.map((h) => h.id)])
  await client.end()
  await Promise.race([drained, new Promise((resolve) => setTimeout(resolve, 120_000))])
  const times = [...arrivals.values()]
  const backlogEventsPerSecond = arrivals.size / ((Math.max(...times) - Math.min(...times)) / 1000)

  for (const { owner, id } of hooks) await fetch(`${url}/v2/webhooks/${id}`, { method: 'DELETE', headers: { authorization: owner.authorization } })
  receiver.closeAllConnections()
  receiver.close()
  return { webhooks: owners.length, ...live, latency: percentiles(latency), backlogEventsPerSecond }
}
