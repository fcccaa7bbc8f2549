import type { IncomingMessage, ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import { sql } from 'drizzle-orm'
import type { FastifyInstance } from 'fastify'
import t from 'tap'
import type { Db } from '../../../src/db/client.js'
import { build } from '../../helper.js'
import { metric } from '../../support/metrics.js'
import { until } from '../../support/until.js'

// A key may hold MAX_LONG_POLLS_PER_KEY streams and waiting long-polls at once. A client that
// closes one and reconnects must find its place free at once: a closed stream used to keep it
// until its 30 s safety wait ran out, a closed long-poll until its wait did, so a reconnect
// storm locked the key out (429) for up to 30 s. It happened when the client went while the
// request was reading the feed, as it does in a storm, when reads queue: here the feed is held
// still by a lock until the server has seen every close, so every close lands there.
const MAX = 3
const ENV = { RATE_LIMIT_PER_SECOND: '100000', MAX_LONG_POLLS_PER_KEY: String(MAX) }

/** Holds every read of the events table until released; resolves once the lock is held. */
async function stallFeedReads (db: Db): Promise<{ release: () => Promise<void> }> {
  let held!: () => void
  let release!: () => void
  const locked = new Promise<void>((resolve) => { held = resolve })
  const released = new Promise<void>((resolve) => { release = resolve })
  const done = db.transaction(async (tx) => {
    await tx.execute(sql`LOCK TABLE events IN ACCESS EXCLUSIVE MODE`)
    held()
    await released
  })
  await Promise.race([locked, done])
  return { release: async () => { release(); await done } }
}

/** How many requests to `path` the server has seen close (answered, or their client gone). */
function closesOf (app: FastifyInstance, path: string): () => number {
  let closed = 0
  app.server.on('request', (req: IncomingMessage, res: ServerResponse) => {
    if (new URL(req.url ?? '/', 'http://x').pathname === path) res.once('close', () => { closed++ })
  })
  return () => closed
}

/** Requests holding a place at the request gate or waiting for one: each read of the feed takes one. */
async function atTheGate (app: FastifyInstance): Promise<number> {
  return (await metric(app, 'parley_admission{gate="request",state="held"}') ?? NaN) +
    (await metric(app, 'parley_admission{gate="request",state="waiting"}') ?? NaN)
}

async function setUp (t: Parameters<typeof build>[0]) {
  const built = await build(t, { env: ENV })
  await built.app.listen({ port: 0, host: '127.0.0.1' })
  const base = `http://127.0.0.1:${(built.app.server.address() as AddressInfo).port}`
  const bob = await built.as('bob')
  // The key is in the authenticator's cache: opening a request needs no query the lock would hold.
  await fetch(`${base}/v2/whoami`, { headers: { authorization: bob.authorization } }).then((r) => r.arrayBuffer())
  return { ...built, base, bob }
}

/**
 * With every request's read held at the gate, the clients close them; once the server has seen
 * each close, the reads go on, and once they are done the key's places must all be free.
 */
async function closeWhileReading (app: FastifyInstance, db: Db, closes: () => number, open: () => Promise<AbortController[]>): Promise<void> {
  const stall = await stallFeedReads(db)
  try {
    const closedBefore = closes()
    const controllers = await open()
    await until(async () => await atTheGate(app) === MAX, { message: `the ${MAX} requests never all reached their read of the feed` })
    for (const c of controllers) c.abort()
    await until(() => closes() - closedBefore === MAX, { message: 'the server never saw every client go' })
  } finally {
    await stall.release()
  }
  await until(async () => await atTheGate(app) === 0, { message: 'the held reads never finished' })
}

t.test('long-polls closed by their client free their places at once', async (t) => {
  const { app, base, bob, db } = await setUp(t)
  const polls = closesOf(app, '/v2/events')
  for (let round = 0; round < 3; round++) {
    await closeWhileReading(app, db, polls, async () => {
      const controllers = Array.from({ length: MAX }, () => new AbortController())
      for (const c of controllers) {
        void fetch(`${base}/v2/events?wait=30`, { headers: { authorization: bob.authorization }, signal: c.signal }).catch(() => undefined)
      }
      return controllers
    })
    const again = await Promise.all(Array.from({ length: MAX }, () =>
      fetch(`${base}/v2/events?wait=1`, { headers: { authorization: bob.authorization } }).then((r) => r.status)))
    t.same(again, Array(MAX).fill(200), `round ${round}: ${MAX} new long-polls all admitted (no 429)`)
  }
})

t.test('event streams closed by their client free their places at once', async (t) => {
  const { app, base, bob, db } = await setUp(t)
  const streams = closesOf(app, '/v2/events/stream')
  for (let round = 0; round < 3; round++) {
    await closeWhileReading(app, db, streams, async () => {
      // The headers come before the first read: each stream is closed while that read is held.
      const opened = await Promise.all(Array.from({ length: MAX }, async () => {
        const controller = new AbortController()
        const res = await fetch(`${base}/v2/events/stream`, { headers: { authorization: bob.authorization }, signal: controller.signal })
        return { controller, res }
      }))
      t.same(opened.map((o) => o.res.status), Array(MAX).fill(200), `round ${round}: ${MAX} streams opened`)
      // Aborted with the rest; the body is let go here so it is not left unread.
      for (const { controller, res } of opened) controller.signal.addEventListener('abort', () => { res.body?.cancel().catch(() => {}) })
      return opened.map((o) => o.controller)
    })
    const again = await Promise.all(Array.from({ length: MAX }, () =>
      fetch(`${base}/v2/events?wait=1`, { headers: { authorization: bob.authorization } }).then((r) => r.status)))
    t.same(again, Array(MAX).fill(200), `round ${round}: then ${MAX} long-polls all admitted (no 429)`)
  }
})
