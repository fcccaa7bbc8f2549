import pg from 'pg'
import t from 'tap'
import type { FastifyInstance } from 'fastify'
import { connectPostgres, POOL_APPLICATION_NAME } from '../../../src/db/client.js'
import { NEWCOMER_RECHECK_MS } from '../../../src/modules/events/announcements.repository.js'
import { createEventBus } from '../../../src/modules/events/event-bus.js'
import { build, type Caller } from '../../helper.js'
import { usingPostgres } from '../../support/databases.js'
import { scrape } from '../../support/metrics.js'
import { until } from '../../support/until.js'

// A process alone on its database hands its announcements to its own listeners instead of
// NOTIFYing them (announcements.repository.ts, Alone); any other session that could listen
// makes it NOTIFY again. The embedded database always NOTIFYs.
const onlyPostgres = usingPostgres() ? false : 'the embedded database always announces with NOTIFY'
const FAST = { RATE_LIMIT_PER_SECOND: '100000' }

async function announced (app: FastifyInstance): Promise<{ own: number, notify: number }> {
  const read = await scrape(app)
  return { own: read('parley_announcements_total{via="own"}') ?? 0, notify: read('parley_announcements_total{via="notify"}') ?? 0 }
}

/** Sends from `from` to `to` (30 at most) until `app` has handed an announcement to its own listeners. */
async function untilAlone (app: FastifyInstance, from: Caller, to: string): Promise<void> {
  const before = (await announced(app)).own
  let sends = 0
  await until(async () => {
    if (++sends > 30) throw new Error(`the app never found itself alone in 30 sends: ${JSON.stringify(await announced(app))}`)
    const res = await from.post('/v2/message', { recipient: to, body: 'warming' })
    if (res.statusCode !== 200) throw new Error(res.body)
    return (await announced(app)).own > before
  }, { intervalMs: 50, message: 'the app never found itself alone' })
}

const MANY = { dailyQuota: 1_000_000 }

t.test('alone on its database, a server tells its own listeners: a long-poll wakes with no NOTIFY', { skip: onlyPostgres }, async (t) => {
  const { app, as } = await build(t, { env: FAST })
  const alice = await as('alice', MANY)
  const bob = await as('bob')
  await untilAlone(app, alice, 'bob')
  const read = (await bob.get('/v2/events?wait=0')).json() as { last: string }

  const poll = bob.get(`/v2/events?after=${read.last}&wait=20`)
  await until(async () => (await scrape(app))('parley_long_polls_open') === 1, { message: 'the long-poll never waited' })
  const before = await announced(app)
  const sentAt = performance.now()
  t.equal((await alice.post('/v2/message', { recipient: 'bob', body: 'by hand' })).statusCode, 200)
  const res = await poll
  const lag = performance.now() - sentAt
  t.match(res.json(), { events: [{ type: 'message.received', data: { message: { body: 'by hand' } } }] })
  t.ok(lag < 1_000, `woken ${lag.toFixed(0)} ms after the send`)
  const after = await announced(app)
  t.ok(after.own > before.own, `the send's announcement went to the app's own listener (${before.own} → ${after.own})`)
  t.equal(after.notify, before.notify, 'and no NOTIFY was made')
})

t.test('a second instance says it listens: the first announces with NOTIFY from then on, and its waiters wake', { skip: onlyPostgres }, async (t) => {
  // The apps' clock held still: the first's look that found it alone is trusted for as long as
  // the test runs, so only the newcomer's empty NOTIFY can end it.
  const still = Date.now()
  const { app, as, secondInstance } = await build(t, { env: FAST, now: () => still })
  const alice = await as('alice', MANY)
  const bob = await as('bob')
  await untilAlone(app, alice, 'bob')

  const other = await secondInstance()
  // No wait for a look: the newcomer's empty NOTIFY ends the first's being alone at once.
  const before = await announced(app)
  const read = (await other.inject({ method: 'GET', url: '/v2/events?wait=0', headers: { authorization: bob.authorization } })).json() as { last: string }
  const poll = other.inject({ method: 'GET', url: `/v2/events?after=${read.last}&wait=20`, headers: { authorization: bob.authorization } })
  await until(async () => (await scrape(other))('parley_long_polls_open') === 1, { message: 'the long-poll never waited' })
  const sentAt = performance.now()
  t.equal((await alice.post('/v2/message', { recipient: 'bob', body: 'across' })).statusCode, 200)
  const res = await poll
  const lag = performance.now() - sentAt
  t.match(res.json(), { events: [{ type: 'message.received', data: { message: { body: 'across' } } }] })
  t.ok(lag < 1_000, `woken on the other instance ${lag.toFixed(0)} ms after the send`)
  const after = await announced(app)
  t.ok(after.notify > before.notify, `the first instance NOTIFYs again (${before.notify} → ${after.notify})`)
  t.equal(after.own, before.own, 'and no longer tells only itself')
})

t.test('a session that listens without saying so (psql, an older instance) hears announcements within a look', { skip: onlyPostgres }, async (t) => {
  const { app, as, url } = await build(t, { env: FAST })
  const alice = await as('alice', MANY)
  await as('bob')
  await untilAlone(app, alice, 'bob')

  const stranger = new pg.Client({ connectionString: url })
  await stranger.connect()
  t.teardown(() => stranger.end())
  const heard: string[] = []
  stranger.on('notification', (msg) => { heard.push(...(msg.payload ?? '').split(',')) })
  await stranger.query('LISTEN parley_events')
  const listening = performance.now()
  // Sends go on; within a look (1 s, and the one under way) the stranger hears of bob's feed.
  await until(async () => {
    t.equal((await alice.post('/v2/message', { recipient: 'bob', body: 'hello?' })).statusCode, 200)
    return heard.includes('bob')
  }, { intervalMs: 50, message: 'the stranger never heard an announcement' })
  const waited = performance.now() - listening
  t.ok(waited < 3_000, `heard ${waited.toFixed(0)} ms after it began to listen`)
})

t.test('a second instance whose URL names its sessions as the pool is named is still heard', { skip: onlyPostgres }, async (t) => {
  const { app, as, url } = await build(t, { env: FAST })
  const alice = await as('alice', MANY)
  await as('bob')
  await untilAlone(app, alice, 'bob')

  // Its pool is named as the first's is (pg prefers the URL's name); its listener names itself.
  const named = new URL(url!)
  named.searchParams.set('application_name', POOL_APPLICATION_NAME)
  const database = await connectPostgres(named.toString(), 2)
  t.teardown(() => database.close())
  const bus = createEventBus(database)
  await bus.start()
  t.teardown(() => bus.stop())
  const heard: string[] = []
  bus.watchAll((addresses) => { heard.push(...addresses) })

  // Long enough for looks after its empty NOTIFY (each trusted 1 s): each must still see it.
  const joined = await announced(app)
  const deadline = performance.now() + 1_500
  let sends = 0
  while (performance.now() < deadline) {
    const res = await alice.post('/v2/message', { recipient: 'bob', body: 'still there?' })
    if (res.statusCode !== 200) throw new Error(res.body)
    sends++
  }
  heard.length = 0
  t.equal((await alice.post('/v2/message', { recipient: 'bob', body: 'last' })).statusCode, 200)
  await untilHeard(heard, 'bob')
  t.equal((await announced(app)).own, joined.own, `the first instance told only itself none of ${sends + 1} sends since`)
})

t.test('a new listener\'s waiters read again once others may have told only themselves', async (t) => {
  const { database } = await build(t)
  const bus = createEventBus(database)
  await bus.start()
  t.teardown(() => bus.stop())
  const started = performance.now()
  const woken = await bus.subscribe('nobody-writes-here').wait(NEWCOMER_RECHECK_MS * 3)
  const after = performance.now() - started
  t.ok(woken, `woken with nothing written, ${after.toFixed(0)} ms after listening`)
  t.ok(after >= NEWCOMER_RECHECK_MS * 0.9, `not before ${NEWCOMER_RECHECK_MS} ms`)
})

async function untilHeard (heard: string[], address: string): Promise<void> {
  await until(() => heard.includes(address), { timeoutMs: 2_000, message: `${address} never heard by the second instance` })
}
