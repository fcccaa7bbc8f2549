import { setTimeout as sleep } from 'node:timers/promises'
import { sql } from 'drizzle-orm'
import pg from 'pg'
import t, { type Test } from 'tap'
import { queryRows } from '../../src/db/rows.js'
import { build } from '../helper.js'
import { usingPostgres } from '../support/databases.js'
import { p99, relativeBound, sendLoop, sendLoops, type Sent } from '../support/bystander.js'

// Someone else's work holds one recipient's user row (its feed) for 5 s: here an operator's
// open transaction on a connection of its own, as a long group change or a stuck client would.
// Sends to other users, by other keys, must not wait for it, on one instance or two; the held
// recipient's own sends succeed once it is let go. PostgreSQL only: the embedded database is
// one connection, where nothing else can hold a row while a send runs.
const skip = usingPostgres() ? false : 'PostgreSQL only: the embedded database is one connection, so no other transaction can hold a row'
const ENV = { RATE_LIMIT_PER_SECOND: '100000', DAILY_MESSAGE_QUOTA: '100000' }
const HOLD_MS = 5_000
const CEILING_MS = 1_000
const BYSTANDERS = 4

async function scenario (t: Test, instances: 1 | 2): Promise<void> {
  const built = await build(t, { env: ENV })
  const bases = [await built.app.listen({ host: '127.0.0.1', port: 0 })]
  if (instances === 2) bases.push(await (await built.secondInstance()).listen({ host: '127.0.0.1', port: 0 }))
  const senders = await Promise.all(Array.from({ length: BYSTANDERS }, (_, i) => built.as(`sender${i}`)))
  for (let i = 0; i < BYSTANDERS; i++) await built.createUser(`peer${i}`)
  // The keys sending to the held user send to no one else: a key's own requests waiting for
  // the held row take its places at admission (docs/security.md), so its other sends queue behind
  // them; what must not happen is that other keys' sends wait.
  const attackers = await Promise.all(['mallory', 'trudy', 'eve'].map((a) => built.as(a)))
  await built.createUser('held')
  const loops = () => sendLoops(senders.map((s, i) => sendLoop(bases, s.authorization, [`peer${i}`, `peer${(i + 1) % BYSTANDERS}`])))

  // Warm, then the bystanders alone.
  await loops().stop()
  let watch = loops()
  await sleep(1_500)
  const alone = await watch.stop()

  const holder = new pg.Client({ connectionString: built.url })
  await holder.connect()
  t.teardown(() => holder.end())
  await holder.query('BEGIN')
  await holder.query("SELECT 1 FROM users WHERE address = 'held' FOR UPDATE")
  const heldAt = performance.now()
  watch = loops()
  // Sends to the held user all along, batched with the bystanders' sends to others.
  const toHeld: Promise<Sent & { at: number }>[] = []
  while (performance.now() - heldAt < HOLD_MS) {
    for (const caller of attackers) {
      const started = performance.now()
      toHeld.push(fetch(`${bases[toHeld.length % bases.length]}/v2/message`, {
        method: 'POST',
        headers: { authorization: caller.authorization, 'content-type': 'application/json' },
        body: JSON.stringify({ recipient: 'held', body: 'to the held one' })
      }).then(async (res) => {
        const text = await res.text()
        if (res.status !== 200) t.comment(`${res.status}: ${text}`)
        return { status: res.status, ms: performance.now() - started, at: performance.now() }
      }))
    }
    await sleep(250)
  }
  // Let go at 5 s whatever the bystanders are doing (a stalled one would otherwise never stop).
  const releasedAt = performance.now()
  await holder.query('ROLLBACK')
  const during = await watch.stop()
  const held = await Promise.all(toHeld)

  const aloneP99 = p99(alone.map((r) => r.ms))
  const duringP99 = p99(during.map((r) => r.ms))
  const bound = relativeBound(aloneP99, CEILING_MS)
  t.comment(`${instances} instance(s): bystanders alone p99 ${aloneP99.toFixed(0)} ms (${alone.length} sends); with a row held, p99 ${duringP99.toFixed(0)} ms (${during.length} sends); bound ${bound.toFixed(0)} ms`)
  t.ok(during.length >= 20, `the bystanders sent ${during.length} messages meanwhile`)
  t.same([...new Set(during.map((r) => r.status))], [200], 'every bystander send answered 200')
  t.ok(duringP99 < bound, `bystander p99 ${duringP99.toFixed(0)} ms < ${bound.toFixed(0)} ms`)
  t.ok(Math.max(...during.map((r) => r.ms)) < HOLD_MS / 2, 'and no bystander send waited for the hold')
  t.same([...new Set(held.map((r) => r.status))], [200], `all ${held.length} sends to the held user answered 200`)
  t.ok(held.every((r) => r.at >= releasedAt), 'each only once its row was let go')
  // One event per send to the held user, none doubled or skipped: ids 1..n.
  const feed = await queryRows<{ n: number, top: number }>(built.db, sql`SELECT count(*)::int AS n, max(seq)::int AS top FROM events WHERE address = 'held'`)
  t.same(feed, [{ n: held.length, top: held.length }], 'the held user\'s feed has one event per send, ids 1..n')
}

t.test('a recipient\'s row held 5 s by another transaction stalls no other send (one instance)', { skip }, (t) => scenario(t, 1))
t.test('a recipient\'s row held 5 s by another transaction stalls no other send (two instances)', { skip }, (t) => scenario(t, 2))
