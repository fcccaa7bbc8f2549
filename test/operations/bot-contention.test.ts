import t from 'tap'
import { sql } from 'drizzle-orm'
import type { Db } from '../../src/db/client.js'
import { queryRows } from '../../src/db/rows.js'
import { build, type Built, type Caller } from '../helper.js'
import { relativeBound } from '../support/bystander.js'
import { until } from '../support/until.js'

const ENV = { RATE_LIMIT_PER_SECOND: '100000', DAILY_MESSAGE_QUOTA: '100000' }

/** A client over a real socket, as one user's key. */
function client (base: string, caller: Caller) {
  return async (method: 'POST' | 'DELETE', path: string, body?: unknown): Promise<{ status: number, ms: number }> => {
    const started = performance.now()
    const res = await fetch(base + path, {
      method,
      headers: { authorization: caller.authorization, ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
      ...(body === undefined ? {} : { body: JSON.stringify(body) })
    })
    await res.arrayBuffer()
    return { status: res.status, ms: performance.now() - started }
  }
}

async function users (built: Built, count: number): Promise<Caller[]> {
  const callers: Caller[] = []
  for (let i = 0; i < count; i++) callers.push(await built.as(`u${i}`))
  return callers
}

async function replies (db: Db): Promise<{ body: string, n: number }[]> {
  return queryRows(db, sql`SELECT body, count(*)::int AS n FROM messages WHERE sender = 'testbot' GROUP BY body`)
}

/** Waits until `expected` replies exist; answers how long that took from `since` (infinite: not within `timeoutMs`). */
async function allAnswered (db: Db, expected: number, since: number, timeoutMs: number): Promise<number> {
  return until(async () => (await replies(db)).length >= expected, { timeoutMs, intervalMs: 50 })
    .then(() => performance.now() - since, () => Number.POSITIVE_INFINITY)
}

const p99 = (values: number[]): number => [...values].sort((a, b) => a - b)[Math.ceil(values.length * 0.99) - 1]!

t.test('20 users messaging the bot while one user sends and types to a group of them: no 5xx, each answered once', async (t) => {
  const built = await build(t, { env: ENV })
  const base = await built.app.listen({ host: '127.0.0.1', port: 0 })
  const members = await users(built, 20)
  const boss = await built.as('boss')
  const group = (await boss.post('/v2/group', { name: 'all', members: members.map((m) => m.address) })).json()
  const asBoss = client(base, boss)
  // The boss's burst: 11 group sends and 11 typing changes at once.
  const burst = (label: string) => {
    const groupSends: Promise<{ status: number, ms: number }>[] = []
    const typing: Promise<{ status: number, ms: number }>[] = []
    for (let round = 0; round < 11; round++) {
      groupSends.push(asBoss('POST', '/v2/message', { recipient: group.id, body: `${label} ${round}` }))
      typing.push(round % 2 === 0 ? asBoss('POST', '/v2/message/typing', { recipient: group.id }) : asBoss('DELETE', `/v2/message/typing/${group.id}`))
    }
    return [Promise.all(groupSends), Promise.all(typing)] as const
  }
  // The same burst alone first: the bound below is relative to it, so a busy machine does not
  // fail the test (CI saw 2.1 s on a slow one against an absolute 2 s) and a stall still does.
  const [aloneSends] = await Promise.all(burst('alone'))
  const aloneP99 = p99(aloneSends.map((r) => r.ms))

  const botSends = members.flatMap((m, i) => Array.from({ length: 3 }, (_, j) =>
    client(base, m)('POST', '/v2/message', { recipient: 'testbot', body: `from ${i} #${j}` })))
  const [bot, sends, types] = await Promise.all([Promise.all(botSends), ...burst('round')])
  t.same([...bot, ...sends, ...types].filter((r) => r.status >= 500).map((r) => r.status), [], 'no 5xx')
  t.same(bot.map((r) => r.status), Array(60).fill(200))
  t.same(sends.map((r) => r.status), Array(11).fill(200))
  t.same(types.map((r) => r.status), Array(11).fill(204))
  const groupP99 = p99(sends.map((r) => r.ms))
  // The bound is PostgreSQL's; the embedded database is one connection, where every request
  // queues behind the bot's and the fan-out's statements (correctness is asserted on both).
  // Five times the burst alone, at least the 2 s this bound was before, never more than 5 s.
  const bound = relativeBound(aloneP99, 5_000, 5, 2_000)
  if (built.url !== undefined) t.ok(groupP99 < bound, `group sends p99 ${groupP99.toFixed(0)} ms < ${bound.toFixed(0)} ms`)
  t.comment(`group sends p99 ${groupP99.toFixed(0)} ms beside the bot's 60, ${aloneP99.toFixed(0)} ms alone`)

  t.ok(Number.isFinite(await allAnswered(built.db, 60, performance.now(), 20_000)), 'all 60 answered')
  // The bot's queue is its feed: once every message.received in it is acknowledged (in the
  // transaction that wrote its reply), nothing is left that could be answered again.
  await until(async () => (await queryRows<{ n: number }>(built.db, sql`
    SELECT count(*)::int AS n FROM events WHERE address = 'testbot' AND type = 'message.received' AND acked_at IS NULL`))[0]!.n === 0,
  { intervalMs: 50, message: 'the bot\'s queue drained' })
  const answered = await replies(built.db)
  t.equal(answered.length, 60)
  t.ok(answered.every((r) => r.n === 1), 'each message answered once')
  t.notMatch(built.logs(), /deadlock detected/, 'no deadlock reached the log')
})

/** Sends `perUser` messages from each of 20 users and times until every one is answered. */
async function timeToAnswer (built: Built, perUser: number): Promise<number> {
  const base = await built.app.listen({ host: '127.0.0.1', port: 0 })
  const members = await users(built, 20)
  const started = performance.now()
  const sent = await Promise.all(members.flatMap((m, i) => Array.from({ length: perUser }, (_, j) =>
    client(base, m)('POST', '/v2/message', { recipient: 'testbot', body: `from ${i} #${j}` }))))
  if (sent.some((r) => r.status !== 200)) throw new Error(`sends failed: ${sent.map((r) => r.status).join(',')}`)
  return allAnswered(built.db, members.length * perUser, started, 40_000)
}

t.test('three instances answer the bot backlog at least as fast as one', async (t) => {
  const one = await build(t, { env: ENV })
  const oneMs = await timeToAnswer(one, 10)
  const three = await build(t, { env: ENV })
  await three.secondInstance()
  await three.secondInstance()
  const threeMs = await timeToAnswer(three, 10)
  t.comment(`200 bot messages: one instance ${oneMs.toFixed(0)} ms, three instances ${threeMs.toFixed(0)} ms`)
  t.ok(Number.isFinite(oneMs) && Number.isFinite(threeMs), 'both answered everything')
  // A guard against the deadlocking bots of #12 (three instances took 5.6x as long as one), not
  // a benchmark: all three instances share this process's two cores with the senders, and in
  // CI runs the ratio ranged 0.85x to 1.8x. The bound catches the old failure, not the noise.
  t.ok(threeMs <= oneMs * 3 + 500, `three instances (${threeMs.toFixed(0)} ms) within 3x one (${oneMs.toFixed(0)} ms)`)
  for (const built of [one, three]) {
    const answered = await replies(built.db)
    t.ok(answered.every((r) => r.n === 1), 'each message answered once')
    t.notMatch(built.logs(), /deadlock detected|could not answer/, 'no deadlock, no failed batch')
  }
})
