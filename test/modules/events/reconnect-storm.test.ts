import type { AddressInfo } from 'node:net'
import { setTimeout as sleep } from 'node:timers/promises'
import { sql } from 'drizzle-orm'
import t from 'tap'
import type { Db } from '../../../src/db/client.js'
import { build } from '../../helper.js'

// A key may hold MAX_LONG_POLLS_PER_KEY streams and waiting long-polls at once. A client that
// closes one and reconnects must find its place free at once: a closed stream used to keep it
// until its 30 s safety wait ran out, a closed long-poll until its wait did, so a reconnect
// storm locked the key out (429) for up to 30 s. It happened when the client went while the
// request was reading the feed, as it does in a storm, when reads queue: here the feed is held
// still by a lock for a moment, so every close lands there.
const MAX = 3
const ENV = { RATE_LIMIT_PER_SECOND: '100000', MAX_LONG_POLLS_PER_KEY: String(MAX) }

/** Holds every read of the events table for `ms`; resolves once the lock is held, with the transaction's end. */
async function stallFeedReads (db: Db, ms: number): Promise<{ released: Promise<void> }> {
  let held!: () => void
  const locked = new Promise<void>((resolve) => { held = resolve })
  const released = db.transaction(async (tx) => {
    await tx.execute(sql`LOCK TABLE events IN ACCESS EXCLUSIVE MODE`)
    held()
    await sleep(ms)
  })
  await locked
  return { released }
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

t.test('long-polls closed by their client free their places at once', async (t) => {
  const { base, bob, db } = await setUp(t)
  for (let round = 0; round < 3; round++) {
    const stall = await stallFeedReads(db, 600)
    const controllers = Array.from({ length: MAX }, () => new AbortController())
    const polls = controllers.map((c) => fetch(`${base}/v2/events?wait=30`, { headers: { authorization: bob.authorization }, signal: c.signal }).catch(() => undefined))
    await sleep(300)
    for (const c of controllers) c.abort()
    await Promise.all(polls)
    await stall.released
    await sleep(200)
    const again = await Promise.all(Array.from({ length: MAX }, () =>
      fetch(`${base}/v2/events?wait=1`, { headers: { authorization: bob.authorization } }).then((r) => r.status)))
    t.same(again, Array(MAX).fill(200), `round ${round}: ${MAX} new long-polls all admitted (no 429)`)
  }
})

t.test('event streams closed by their client free their places at once', async (t) => {
  const { base, bob, db } = await setUp(t)
  for (let round = 0; round < 3; round++) {
    const stall = await stallFeedReads(db, 600)
    // The headers come before the first read: each stream is closed while that read is held.
    const opened = await Promise.all(Array.from({ length: MAX }, async () => {
      const controller = new AbortController()
      const res = await fetch(`${base}/v2/events/stream`, { headers: { authorization: bob.authorization }, signal: controller.signal })
      controller.abort()
      await res.body?.cancel().catch(() => {})
      return res.status
    }))
    t.same(opened, Array(MAX).fill(200), `round ${round}: ${MAX} streams opened`)
    await stall.released
    await sleep(200)
    const again = await Promise.all(Array.from({ length: MAX }, () =>
      fetch(`${base}/v2/events?wait=1`, { headers: { authorization: bob.authorization } }).then((r) => r.status)))
    t.same(again, Array(MAX).fill(200), `round ${round}: then ${MAX} long-polls all admitted (no 429)`)
  }
})
