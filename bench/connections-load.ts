/**
 * The load side of `npm run bench:connections` (bench/connections.ts), run in child processes of
 * its own so that the connections' client work is not on the server's or the measuring
 * process's event loop. Opens the event streams and long-polls it is given, keeps them open
 * (a long-poll is issued again as soon as it answers, a stream reconnects with Last-Event-ID if
 * it is cut), and tells its parent over IPC when a connection received a message whose body is
 * a bench tag (`wake:<n>`, `fan:<n>`), timed on the machine's monotonic clock, which both
 * processes share.
 */
import { Agent, request, type ClientRequest, type IncomingMessage } from 'node:http'
import { monitorEventLoopDelay } from 'node:perf_hooks'

/** One connection to open: `after` is its user's last event id when the phase began. */
export interface ConnectionSpec { id: number, kind: 'sse' | 'poll', authorization: string, after: number }

export type ToLoad =
  | { type: 'open', url: string, connections: ConnectionSpec[] }
  | { type: 'stats' }
  | { type: 'close' }

export interface LoadStats {
  /** Streams answered 200 and long-polls written, at least once each. */
  streamsOpen: number
  pollsIssued: number
  /** Answers to long-polls (with events or after their wait ran out). */
  pollAnswers: number
  reconnects: number
  errors: number
  /** The first few errors, for the report. */
  errorSamples: string[]
  rss: number
  /** This process's event-loop lag since the last stats (ms; the 10 ms resolution taken off). */
  lagP50: number
  lagP99: number
  lagMax: number
}

export type FromLoad =
  | { type: 'opened', stats: LoadStats }
  | { type: 'deliveries', deliveries: Delivery[] }
  | { type: 'stats', stats: LoadStats }

/** Connection `conn` received the message tagged `tag` at `at` (monotonicMs). */
export interface Delivery { tag: string, conn: number, at: number }

/** Milliseconds on CLOCK_MONOTONIC: comparable between processes of one machine. */
export function monotonicMs (): number {
  return Number(process.hrtime.bigint() / 1000n) / 1000
}

/** The messages the bench times: their bodies are `wake:<n>` and `fan:<n>` (background sends' are `bg:<n>`). */
const TAG = /"body":"((?:wake|fan):\d+)"/g
/** Connections opened at once: each batch waits for its streams' answers before the next. */
const OPEN_BATCH = 250
const RETRY_MS = 1_000
const POLL_WAIT_SECONDS = 30
const LAG_RESOLUTION_MS = 10

export function runLoad (): void {
  const send = (message: FromLoad) => { process.send?.(message) }
  const agent = new Agent({ keepAlive: true, maxSockets: Infinity })
  const lag = monitorEventLoopDelay({ resolution: LAG_RESOLUTION_MS })
  lag.enable()
  const open = new Set<ClientRequest>()
  let closing = false
  const stats = { streamsOpen: 0, pollsIssued: 0, pollAnswers: 0, reconnects: 0, errors: 0, errorSamples: [] as string[] }

  // Deliveries go to the parent in batches, once a turn of the loop: a fan-out's thousands of
  // them cost one IPC message each turn, not one each.
  let pending: Delivery[] = []
  const deliver = (conn: number, text: string, at: number) => {
    for (const match of text.matchAll(TAG)) {
      if (pending.length === 0) {
        setImmediate(() => {
          send({ type: 'deliveries', deliveries: pending })
          pending = []
        })
      }
      pending.push({ tag: match[1]!, conn, at })
    }
  }

  const failed = (what: string) => {
    stats.errors++
    if (stats.errorSamples.length < 10) stats.errorSamples.push(what)
  }

  const snapshot = (): LoadStats => {
    const ms = (ns: number) => Math.max(0, ns / 1e6 - LAG_RESOLUTION_MS)
    const out = { ...stats, errorSamples: [...stats.errorSamples], rss: process.memoryUsage.rss(), lagP50: ms(lag.percentile(50)), lagP99: ms(lag.percentile(99)), lagMax: ms(lag.max) }
    lag.reset()
    return out
  }

  /** An event stream, reconnecting after the last event it had; resolves once it first answers. */
  const stream = (url: string, spec: ConnectionSpec): Promise<void> => new Promise((resolve) => {
    let lastId = spec.after
    let everOpen = false
    const connect = () => {
      if (closing) return
      const req = request(`${url}/v2/events/stream`, {
        agent,
        headers: { authorization: spec.authorization, accept: 'text/event-stream', 'last-event-id': String(lastId) }
      }, (res: IncomingMessage) => {
        if (res.statusCode !== 200) {
          failed(`stream answered ${res.statusCode}`)
          res.resume()
          return
        }
        if (!everOpen) { everOpen = true; stats.streamsOpen++; resolve() }
        let buffered = ''
        // A stream cut by the server: its request's close reconnects.
        res.on('error', () => {})
        res.setEncoding('utf8').on('data', (chunk: string) => {
          const at = monotonicMs()
          buffered += chunk
          // Only whole events: a tag split between two chunks is found once its event is complete.
          const end = buffered.lastIndexOf('\n\n')
          if (end < 0) return
          const events = buffered.slice(0, end)
          buffered = buffered.slice(end + 2)
          for (const id of events.matchAll(/^id: (\d+)$/gm)) lastId = Number(id[1])
          deliver(spec.id, events, at)
        })
      })
      open.add(req)
      req.on('close', () => {
        open.delete(req)
        if (closing) return
        stats.reconnects++
        if (!everOpen) { everOpen = true; resolve() }
        setTimeout(connect, RETRY_MS)
      })
      req.on('error', (err) => { if (!closing) failed(`stream: ${err.message}`) })
      req.end()
    }
    connect()
  })

  /** A long-poll issued again whenever it answers; resolves once the first is written. */
  const poll = (url: string, spec: ConnectionSpec): Promise<void> => new Promise((resolve) => {
    let after = spec.after
    let first = true
    const issue = () => {
      if (closing) return
      // Once per request: an answer, or a failure (its request's or its response's, not both).
      let settled = false
      const retry = (why: string) => {
        if (settled || closing) return
        settled = true
        failed(why)
        setTimeout(issue, RETRY_MS)
      }
      const req = request(`${url}/v2/events?after=${after}&wait=${POLL_WAIT_SECONDS}`, { agent, headers: { authorization: spec.authorization } }, (res) => {
        let body = ''
        res.on('error', (err) => retry(`poll: ${err.message}`))
        res.setEncoding('utf8').on('data', (chunk: string) => { body += chunk })
        res.on('end', () => {
          const at = monotonicMs()
          if (res.statusCode !== 200) return retry(`poll answered ${res.statusCode}: ${body.slice(0, 200)}`)
          if (settled) return
          settled = true
          stats.pollAnswers++
          after = Number((JSON.parse(body) as { last: string }).last)
          deliver(spec.id, body, at)
          issue()
        })
      })
      open.add(req)
      req.on('close', () => open.delete(req))
      req.on('error', (err) => retry(`poll: ${err.message}`))
      req.end(() => {
        if (!first) return
        first = false
        stats.pollsIssued++
        resolve()
      })
    }
    issue()
  })

  process.on('message', (message: ToLoad) => {
    if (message.type === 'open') {
      void (async () => {
        const { url, connections } = message
        for (let i = 0; i < connections.length; i += OPEN_BATCH) {
          await Promise.all(connections.slice(i, i + OPEN_BATCH).map((spec) => spec.kind === 'sse' ? stream(url, spec) : poll(url, spec)))
        }
        send({ type: 'opened', stats: snapshot() })
      })()
    } else if (message.type === 'stats') {
      send({ type: 'stats', stats: snapshot() })
    } else {
      closing = true
      for (const req of open) req.destroy()
      agent.destroy()
      process.disconnect()
    }
  })
}
