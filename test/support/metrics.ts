import type { FastifyInstance } from 'fastify'

/**
 * One GET /metrics of the app (or of a server, given its `/metrics` address), read by series as
 * the text names them (`parley_long_polls_open`, `parley_admission{gate="request",state="held"}`):
 * undefined for a series it does not report. Several series read from one scrape are of the same
 * moment.
 */
export async function scrape (metrics: string | FastifyInstance): Promise<(series: string) => number | undefined> {
  const text = typeof metrics === 'string'
    ? await (await fetch(metrics)).text()
    : (await metrics.inject({ method: 'GET', url: '/metrics' })).body
  const lines = text.split('\n')
  return (series) => {
    const line = lines.find((l) => l.startsWith(`${series} `))
    return line === undefined ? undefined : Number(line.slice(series.length + 1))
  }
}

/** The value of one series of the app's GET /metrics (see scrape). */
export async function metric (app: FastifyInstance, series: string): Promise<number | undefined> {
  return (await scrape(app))(series)
}

/**
 * GET /v2/events requests waiting for an event now (`parley_long_polls_open`), read from a
 * `/metrics` address or, for an app in this process, through `inject`. What a test waits for
 * before it sends the event a long-poll is to wake on, instead of sleeping a guess.
 */
export async function longPollsWaiting (metrics: string | FastifyInstance): Promise<number> {
  const value = (await scrape(metrics))('parley_long_polls_open')
  if (value === undefined) throw new Error('no parley_long_polls_open in /metrics')
  return value
}
