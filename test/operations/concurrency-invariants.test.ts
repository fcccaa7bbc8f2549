import type { FastifyInstance } from 'fastify'
import t from 'tap'
import { build, type Caller } from '../helper.js'

/**
 * Invariants under concurrency with two app instances on one database (on PostgreSQL each with
 * its own pool and LISTEN connection; on PGlite sharing the one connection). The daily quota,
 * one Idempotency-Key and no skipped events are proven in the events and messages tests; these
 * are the races between different kinds of writes.
 */
const FAST = { RATE_LIMIT_PER_SECOND: '100000' }

interface FeedEvent { id: string, type: string, data: { message?: { id: string, body: string, recipient: string }, group?: string, members?: string[] } }

/** Reads a feed whole, following `after = last`. */
async function readFeed (app: FastifyInstance, caller: Caller): Promise<FeedEvent[]> {
  const all: FeedEvent[] = []
  let last = '0'
  for (;;) {
    const res = await app.inject({ method: 'GET', url: `/v2/events?after=${last}&limit=1000`, headers: { authorization: caller.authorization } })
    const page = res.json() as { events: FeedEvent[], last: string }
    if (page.events.length === 0) return all
    all.push(...page.events)
    last = page.last
  }
}

const yieldTurn = () => new Promise((resolve) => setImmediate(resolve))

/** Each writer sends `perWriter` messages to `reader`, alternating between the two instances. */
function writeToReader (instances: [FastifyInstance, FastifyInstance], writers: Caller[], perWriter: number) {
  let running = true
  const done = Promise.all(writers.map(async (w, i) => {
    for (let n = 0; n < perWriter; n++) {
      const res = await instances[(n + i) % 2]!.inject({ method: 'POST', url: '/v2/message', headers: { authorization: w.authorization }, payload: { recipient: 'reader', body: `${w.address}:${n}` } })
      if (res.statusCode !== 200) throw new Error(res.body)
      await yieldTurn()
    }
  })).finally(() => { running = false })
  return { done, running: () => running }
}

t.test('membership changes racing group sends never deliver to a non-member, nor miss a member', async (t) => {
  const { app, as, secondInstance } = await build(t, { env: FAST })
  const other = await secondInstance()
  const alice = await as('alice', { dailyQuota: 100_000 })
  const bob = await as('bob')
  const carol = await as('carol')
  const created = await alice.post('/v2/group', { name: 'race', members: ['bob', 'carol'] })
  t.equal(created.statusCode, 200)
  const group = (created.json() as { id: string }).id

  // alice sends on one instance while, on the other, carol is removed and added back again and
  // again (by alice), and carol leaves on her own once in a while.
  let sending = true
  const acknowledged: string[] = []
  const sends = Promise.all([0, 1, 2].map(async (w) => {
    for (let n = 0; sending; n++) {
      const res = await app.inject({ method: 'POST', url: '/v2/message', headers: { authorization: alice.authorization }, payload: { recipient: group, body: `g${w}-${n}` } })
      if (res.statusCode !== 200) throw new Error(`send answered ${res.statusCode}: ${res.body}`)
      acknowledged.push((res.json() as { id: string }).id)
      await yieldTurn()
    }
  }))
  const changes: number[] = []
  for (let round = 0; round < 25; round++) {
    const leaving = round % 5 === 4
    const removed = await other.inject({
      method: 'POST',
      url: `/v2/group/${group}/members/remove`,
      headers: { authorization: (leaving ? carol : alice).authorization },
      payload: { members: ['carol'] }
    })
    changes.push(removed.statusCode)
    await yieldTurn()
    const added = await other.inject({ method: 'POST', url: `/v2/group/${group}/members`, headers: { authorization: alice.authorization }, payload: { members: ['carol'] } })
    changes.push(added.statusCode)
    await yieldTurn()
  }
  sending = false
  await sends
  t.ok(changes.every((status) => status === 200), 'every membership change succeeded')

  // bob, a member throughout, sees every change and every message in the order they took the
  // group row: his feed says whether carol was a member when each message was sent.
  const bobFeed = await readFeed(app, bob)
  const carolReceived = new Set((await readFeed(other, carol))
    .filter((e) => e.type === 'message.received' && e.data.message?.recipient === group)
    .map((e) => e.data.message!.id))
  let carolIsMember = true
  const wrong: string[] = []
  let toCarol = 0
  let notToCarol = 0
  const bobReceived = new Set<string>()
  for (const e of bobFeed) {
    if (e.type === 'group.members_removed' && e.data.members?.includes('carol')) carolIsMember = false
    if (e.type === 'group.members_added' && e.data.members?.includes('carol')) carolIsMember = true
    if (e.type !== 'message.received' || e.data.message?.recipient !== group) continue
    const id = e.data.message.id
    bobReceived.add(id)
    if (carolIsMember) toCarol++
    else notToCarol++
    if (carolIsMember !== carolReceived.has(id)) wrong.push(`${e.data.message.body}: carol ${carolIsMember ? 'a member but missed it' : 'not a member but got it'}`)
  }
  t.same(wrong, [], `${toCarol} messages sent while carol was a member, ${notToCarol} while she was not`)
  t.ok(notToCarol > 0 && toCarol > 0, 'the race had sends on both sides of the changes')
  t.same(acknowledged.filter((id) => !bobReceived.has(id)), [], `bob received all ${acknowledged.length} acknowledged messages`)
  t.equal(carolReceived.size, toCarol, 'carol received nothing else')
})

t.test('acknowledging while reading never loses an unacknowledged event', async (t) => {
  const { app, as, secondInstance } = await build(t, { env: FAST })
  const other = await secondInstance()
  const reader = await as('reader')
  const writers = await Promise.all(['w1', 'w2', 'w3', 'w4'].map((w) => as(w)))
  const perWriter = 20
  const expected = writers.length * perWriter

  const writes = writeToReader([app, other], writers, perWriter)

  // One reader follows `after = last` on one instance; acknowledgements of what it has read go
  // to the other instance without waiting: single ids, and now and then everything up to an id.
  const seen: number[] = []
  const acked = new Set<number>()
  const acks: Promise<void>[] = []
  let last = '0'
  const deadline = Date.now() + 60_000
  while ((writes.running() || seen.length < expected) && Date.now() < deadline) {
    const res = await app.inject({ method: 'GET', url: `/v2/events?after=${last}&limit=5&wait=${writes.running() ? 0 : 1}`, headers: { authorization: reader.authorization } })
    const page = res.json() as { events: { id: string }[], last: string }
    last = page.last
    for (const e of page.events) seen.push(Number(e.id))
    const ids = page.events.map((e) => Number(e.id)).filter((id) => id % 3 === 0)
    const upTo = page.events.length > 0 && seen.length % 25 < page.events.length && seen.length > 20 ? seen[seen.length - 20] : undefined
    if (upTo === undefined && ids.length === 0) { await yieldTurn(); continue }
    acks.push((async () => {
      const payload = upTo !== undefined ? { upTo: String(upTo) } : { ids: ids.map(String) }
      const answer = await other.inject({ method: 'POST', url: '/v2/events/ack', headers: { authorization: reader.authorization }, payload })
      if (answer.statusCode !== 204) throw new Error(answer.body)
      if (upTo !== undefined) for (const id of seen) { if (id <= upTo) acked.add(id) }
      else for (const id of ids) acked.add(id)
    })())
    await yieldTurn()
  }
  await writes.done
  await Promise.all(acks)

  t.same(seen, Array.from({ length: expected }, (_, i) => i + 1), 'the reader saw every event once, in order')
  const remaining = (await readFeed(app, reader)).map((e) => Number(e.id))
  const unacknowledged = seen.filter((id) => !acked.has(id))
  t.same(remaining, unacknowledged, `the ${unacknowledged.length} unacknowledged events are all still there, the ${acked.size} acknowledged gone`)
  t.ok(acked.size > 0 && unacknowledged.length > 0, 'some events of each kind')
})

t.test('a consumer that reads from the start and acknowledges what it read gets every event once', async (t) => {
  const { app, as, secondInstance } = await build(t, { env: FAST })
  const other = await secondInstance()
  const reader = await as('reader')
  const writers = await Promise.all(['w1', 'w2', 'w3'].map((w) => as(w)))
  const perWriter = 20
  const writes = writeToReader([app, other], writers, perWriter)

  const bodies: string[] = []
  const deadline = Date.now() + 60_000
  for (let turn = 0; (writes.running() || bodies.length < writers.length * perWriter) && Date.now() < deadline; turn++) {
    const instance = turn % 2 === 0 ? app : other
    const res = await instance.inject({ method: 'GET', url: `/v2/events?limit=4&wait=${writes.running() ? 0 : 1}`, headers: { authorization: reader.authorization } })
    const page = res.json() as { events: { id: string, data: { message: { body: string } } }[] }
    bodies.push(...page.events.map((e) => e.data.message.body))
    if (page.events.length > 0) {
      const ack = await (turn % 2 === 0 ? other : app).inject({ method: 'POST', url: '/v2/events/ack', headers: { authorization: reader.authorization }, payload: { ids: page.events.map((e) => e.id) } })
      if (ack.statusCode !== 204) throw new Error(ack.body)
    }
    await yieldTurn()
  }
  await writes.done
  t.equal(bodies.length, writers.length * perWriter, 'every event')
  t.equal(new Set(bodies).size, bodies.length, 'none twice')
  t.same(await readFeed(app, reader), [], 'nothing left unacknowledged')
})
