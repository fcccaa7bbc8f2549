import t from 'tap'
import { request } from 'node:http'
import type { AddressInfo } from 'node:net'
import type { FastifyInstance } from 'fastify'
import { build } from '../../helper.js'
import { openStream } from '../../support/event-stream.js'
import { metric } from '../../support/metrics.js'
import { until } from '../../support/until.js'

const ENV = { RATE_LIMIT_PER_SECOND: '100000', EVENT_STREAM_HEARTBEAT_SECONDS: '1', MAX_LONG_POLLS_PER_KEY: '2' }

async function listen (app: FastifyInstance): Promise<string> {
  await app.listen({ port: 0, host: '127.0.0.1' })
  return `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`
}

t.test('GET /v2/events/stream delivers a send on another instance at once, resumes after Last-Event-ID, and heartbeats', async (t) => {
  const { app, as, secondInstance } = await build(t, { env: ENV })
  const other = await secondInstance()
  const base = await listen(app)
  const alice = await as('alice')
  const bob = await as('bob')

  const stream = await openStream(`${base}/v2/events/stream`, bob.authorization)
  t.equal(stream.res.status, 200)
  t.match(stream.res.headers.get('content-type'), /^text\/event-stream/)
  const sentAt = Date.now()
  const sent = await other.inject({ method: 'POST', url: '/v2/message', headers: { authorization: alice.authorization }, payload: { recipient: 'bob', body: 'one' } })
  t.equal(sent.statusCode, 200)
  t.ok(await stream.until(() => stream.received.length === 1), 'the event arrived')
  const lag = Date.now() - sentAt
  t.ok(lag < 1_000, `received ${lag} ms after the send`)
  t.match(stream.received[0], { id: '1', event: 'message.received', data: { id: '1', type: 'message.received', data: { message: { body: 'one' } } } })
  t.ok(await stream.until(() => stream.comments() >= 2, 4_000), `heartbeat comments seen (${stream.comments()})`)
  stream.close()
  await stream.done

  // Missed while disconnected: two events; reconnecting after id 1 gets exactly those.
  for (const body of ['two', 'three']) {
    await other.inject({ method: 'POST', url: '/v2/message', headers: { authorization: alice.authorization }, payload: { recipient: 'bob', body } })
  }
  const again = await openStream(`${base}/v2/events/stream?after=0`, bob.authorization, { 'last-event-id': '1' })
  t.ok(await again.until(() => again.received.length >= 2))
  // Then one sent now: a stream writes in order, so anything more it had for the missed ones
  // (a repeat, or the events up to after=0) comes before it.
  await other.inject({ method: 'POST', url: '/v2/message', headers: { authorization: alice.authorization }, payload: { recipient: 'bob', body: 'four' } })
  t.ok(await again.until(() => again.received.some((e) => e.data.data.message?.body === 'four')), 'the new event arrived')
  t.same(again.received.map((e) => [e.id, e.data.data.message?.body]), [['2', 'two'], ['3', 'three'], ['4', 'four']], 'exactly the missed events, Last-Event-ID winning over after, then the new one')
  const acked = await bob.get('/v2/events')
  t.equal(acked.json().events.length, 4, 'streaming acknowledged nothing')
  again.close()
  await again.done
})

t.test('streams and long-polls share MAX_LONG_POLLS_PER_KEY; a bad Last-Event-ID is a 400', async (t) => {
  const { app, as } = await build(t, { env: ENV })
  const base = await listen(app)
  const bob = await as('bob')
  const stream = await openStream(`${base}/v2/events/stream`, bob.authorization)
  const poll = fetch(`${base}/v2/events?wait=5`, { headers: { authorization: bob.authorization } })
  await until(async () => await metric(app, 'parley_long_polls_open') === 1, { message: 'the long-poll never waited' })
  const third = await fetch(`${base}/v2/events/stream`, { headers: { authorization: bob.authorization } })
  t.equal(third.status, 429)
  t.match(await third.json(), { code: 'RATE_LIMITED', message: 'Too many requests/second, please try again later' })
  const bad = await fetch(`${base}/v2/events/stream`, { headers: { authorization: bob.authorization, 'last-event-id': 'x1' } })
  t.equal(bad.status, 400)
  t.match(await bad.json(), { code: 'VALIDATION_FAILED', message: /Last-Event-ID/ })
  stream.close()
  await stream.done
  await poll
})

t.test('closing the app ends open streams promptly', async (t) => {
  const { app, as } = await build(t, { env: ENV })
  const base = await listen(app)
  const bob = await as('bob')
  // Closed at once: closing must end the stream promptly whether it is still reading bob's feed
  // or already waiting on it (the bus wakes every waiter, and refuses new waits, once closing).
  const stream = await openStream(`${base}/v2/events/stream`, bob.authorization)
  const started = Date.now()
  await app.close()
  await stream.done
  const took = Date.now() - started
  t.ok(took < 3_000, `stream ended and app closed ${took} ms after close()`)
})

t.test('a stream whose client leaves while a page is still being written gives its slot back', async (t) => {
  // One stream a key: a stream that never ended would refuse every later one with 429.
  const { app, as } = await build(t, { env: { ...ENV, MAX_LONG_POLLS_PER_KEY: '1' } })
  const base = await listen(app)
  const alice = await as('alice')
  const bob = await as('bob')
  // Pages of 100 events of 9,000 characters: more than a socket takes at once, so writes wait on drain.
  const setup = Date.now()
  for (let i = 0; i < 300; i++) await alice.post('/v2/message', { recipient: 'bob', body: `${i} ${'x'.repeat(9_000)}` })
  t.comment(`setup ${Date.now() - setup} ms`)
  for (let round = 0; round < 10; round++) {
    const roundStarted = Date.now()
    let status = 0
    // Tried until the slot is free: the last round's stream gives it back when the server sees its close.
    await until(async () => {
      // Read the first bytes, then drop the connection mid-page.
      status = await new Promise<number>((resolve, reject) => {
        const req = request(`${base}/v2/events/stream`, { headers: { authorization: bob.authorization } }, (res) => {
          res.once('data', () => { req.destroy(); resolve(res.statusCode ?? 0) })
        })
        req.on('error', reject)
        req.end()
      })
      return status === 200
    }, { timeoutMs: 5_000, intervalMs: 50, message: `round ${round}: the key's one stream slot stayed taken for 5 s` })
    t.equal(status, 200, `round ${round}: the key's one stream slot is free (${Date.now() - roundStarted} ms)`)
  }
})
