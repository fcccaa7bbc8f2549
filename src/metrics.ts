import { collectDefaultMetrics, Registry } from 'prom-client'

/**
 * The service's Prometheus metrics, kept in memory and written in the text exposition format
 * (version 0.0.4). Small on purpose: counters, gauges read at scrape time, and one histogram;
 * the standard process and Node.js metrics (CPU, memory, file descriptors, event-loop lag, GC)
 * come from prom-client's default collectors.
 */

type Labels = Record<string, string>

const BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30]
/** A send's stages take a millisecond or a few: finer at the low end. */
const STAGE_BUCKETS = [0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.02, 0.05, 0.1, 0.25, 1]

/**
 * A series' key among its metric's: each label's name and its value, length first, so no two
 * label sets share one. A sixth of labelText's cost (0.08 against 0.61 µs for a request's three
 * labels, which it escapes): a send observes about seven series, and renders are rare.
 */
function seriesKey (labels: Labels): string {
  let key = ''
  for (const name in labels) {
    const value = labels[name]!
    key += `${name}=${value.length}:${value}`
  }
  return key
}

function labelText (labels: Labels): string {
  const pairs = Object.entries(labels).map(([k, v]) => `${k}="${v.replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\n/g, '\\n')}"`)
  return pairs.length === 0 ? '' : `{${pairs.join(',')}}`
}

class Counter {
  private readonly values = new Map<string, { labels: Labels, value: number }>()
  readonly name: string
  readonly help: string

  constructor (name: string, help: string) {
    this.name = name
    this.help = help
  }

  inc (labels: Labels = {}, by = 1): void {
    const key = seriesKey(labels)
    const entry = this.values.get(key)
    if (entry === undefined) this.values.set(key, { labels, value: by })
    else entry.value += by
  }

  render (): string[] {
    const lines = [`# HELP ${this.name} ${this.help}`, `# TYPE ${this.name} counter`]
    if (this.values.size === 0) lines.push(`${this.name} 0`)
    for (const { labels, value } of this.values.values()) lines.push(`${this.name}${labelText(labels)} ${value}`)
    return lines
  }
}

class Histogram {
  private readonly series = new Map<string, { labels: Labels, counts: number[], sum: number, count: number }>()
  readonly name: string
  readonly help: string
  readonly buckets: readonly number[]

  constructor (name: string, help: string, buckets: readonly number[] = BUCKETS) {
    this.name = name
    this.help = help
    this.buckets = buckets
  }

  observe (labels: Labels, seconds: number): void {
    const key = seriesKey(labels)
    let s = this.series.get(key)
    if (s === undefined) this.series.set(key, s = { labels, counts: this.buckets.map(() => 0), sum: 0, count: 0 })
    for (let i = 0; i < this.buckets.length; i++) if (seconds <= this.buckets[i]!) s.counts[i]! += 1
    s.sum += seconds
    s.count += 1
  }

  render (): string[] {
    const lines = [`# HELP ${this.name} ${this.help}`, `# TYPE ${this.name} histogram`]
    for (const s of this.series.values()) {
      this.buckets.forEach((le, i) => lines.push(`${this.name}_bucket${labelText({ ...s.labels, le: String(le) })} ${s.counts[i]}`))
      lines.push(`${this.name}_bucket${labelText({ ...s.labels, le: '+Inf' })} ${s.count}`)
      lines.push(`${this.name}_sum${labelText(s.labels)} ${s.sum}`)
      lines.push(`${this.name}_count${labelText(s.labels)} ${s.count}`)
    }
    return lines
  }
}

type GaugeRead = () => { labels?: Labels, value: number }[]

let processMetrics: Registry | undefined

/** process_* and nodejs_* metrics: one set per process, however many apps it builds (tests). */
function processRegistry (): Registry {
  if (processMetrics === undefined) {
    processMetrics = new Registry()
    collectDefaultMetrics({ register: processMetrics })
  }
  return processMetrics
}

export function createMetrics () {
  const requests = new Counter('parley_http_requests_total', 'HTTP requests answered, by method, route and status')
  const duration = new Histogram('parley_http_request_duration_seconds', 'Time to answer, by method and route')
  const messagesSent = new Counter('parley_messages_sent_total', 'Messages committed by POST /v2/message (not replays)')
  const refusals = new Counter('parley_refusals_total', 'Requests refused, by reason (quota, rate_limit)')
  const errors = new Counter('parley_errors_total', 'Error answers, by code')
  // Commit coalescing: sends per batch on average is the ratio of the two rates.
  const sendBatches = new Counter('parley_send_batches_total', 'Statements that wrote coalesced 1:1 sends (POST /v2/message)')
  const sendsBatched = new Counter('parley_send_batched_total', 'Sends those statements carried; divided by parley_send_batches_total, the mean batch')
  // Where a send's time goes before its answer (issue #34): its wait for a batch, and its batch's statement.
  const sendStages = new Histogram('parley_send_stage_seconds',
    'POST /v2/message: each send\'s wait in its lane for a batch (stage="queued"), each batch\'s statement (with groups or Idempotency-Keys, its transaction) until it answered (stage="statement")', STAGE_BUCKETS)
  const gauges: { name: string, help: string, read: GaugeRead }[] = []
  const counters: Counter[] = []

  return {
    observeRequest (method: string, route: string, status: number, seconds: number): void {
      requests.inc({ method, route, status: String(status) })
      duration.observe({ method, route }, seconds)
    },
    messageSent (): void {
      messagesSent.inc()
    },
    sendBatch (size: number): void {
      sendBatches.inc({})
      sendsBatched.inc({}, size)
    },
    sendStage (stage: string, seconds: number): void {
      sendStages.observe({ stage }, seconds)
    },
    error (code: string): void {
      errors.inc({ code })
      if (code === 'QUOTA_EXCEEDED') refusals.inc({ reason: 'quota' })
      if (code === 'RATE_LIMITED') refusals.inc({ reason: 'rate_limit' })
    },
    /** A counter of a module's own (replica reads by outcome): call the answer to count. */
    counter (name: string, help: string): (labels?: Labels) => void {
      const counter = new Counter(name, help)
      counters.push(counter)
      return (labels) => counter.inc(labels)
    },
    /** A value read at each scrape (open long-polls, pool connections). */
    gauge (name: string, help: string, read: GaugeRead): void {
      gauges.push({ name, help, read })
    },
    async render (): Promise<string> {
      const lines = [...requests.render(), ...duration.render(), ...messagesSent.render(), ...sendBatches.render(), ...sendsBatched.render(), ...sendStages.render(), ...refusals.render(), ...errors.render(), ...counters.flatMap((c) => c.render())]
      for (const g of gauges) {
        lines.push(`# HELP ${g.name} ${g.help}`, `# TYPE ${g.name} gauge`)
        for (const { labels, value } of g.read()) lines.push(`${g.name}${labelText(labels ?? {})} ${value}`)
      }
      return `${lines.join('\n')}\n${await processRegistry().metrics()}`
    }
  }
}

export type Metrics = ReturnType<typeof createMetrics>
