import type { FastifyInstance } from 'fastify'

/**
 * GET /v2/events requests waiting for an event now (`parley_long_polls_open`), read from a
 * `/metrics` address or, for an app in this process, through `inject`. What a test waits for
 * before it sends the event a long-poll is to wake on, instead of sleeping a guess.
 */
export async function longPollsWaiting (metrics: string | FastifyInstance): Promise<number> {
  const text = typeof metrics === 'string'
    ? await (await fetch(metrics)).text()
    : (await metrics.inject({ method: 'GET', url: '/metrics' })).body
  const value = /^parley_long_polls_open (\d+)$/m.exec(text)?.[1]
  if (value === undefined) throw new Error('no parley_long_polls_open in /metrics')
  return Number(value)
}
