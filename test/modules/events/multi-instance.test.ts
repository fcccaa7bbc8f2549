import t from 'tap'
import { sql } from 'drizzle-orm'
import { queryRows } from '../../../src/db/rows.js'
import { build } from '../../helper.js'
import { metric } from '../../support/metrics.js'
import { until } from '../../support/until.js'

const FAST = { RATE_LIMIT_PER_SECOND: '100000' }

t.test('a long-poll on one instance wakes within 1 s of a send on another', async (t) => {
  const { app, as, secondInstance } = await build(t, { env: FAST })
  const other = await secondInstance()
  const alice = await as('alice')
  const bob = await as('bob')
  const poll = other.inject({ method: 'GET', url: '/v2/events?wait=20', headers: { authorization: bob.authorization } })
  await until(async () => await metric(other, 'parley_long_polls_open') === 1, { message: 'the long-poll never waited' })
  const sentAt = Date.now()
  const sent = await app.inject({ method: 'POST', url: '/v2/message', headers: { authorization: alice.authorization }, payload: { recipient: 'bob', body: 'across' } })
  t.equal(sent.statusCode, 200)
  const res = await poll
  const lag = Date.now() - sentAt
  t.match(res.json(), { events: [{ type: 'message.received', data: { message: { body: 'across' } } }] })
  t.ok(lag < 1_000, `woken ${lag} ms after the send`)
})

t.test('no skipped events: many writers on two instances, one reader following after = last', async (t) => {
  const { app, as, secondInstance } = await build(t, { env: FAST })
  const other = await secondInstance()
  const reader = await as('reader')
  const writers = await Promise.all(['w1', 'w2', 'w3', 'w4', 'w5', 'w6'].map((w) => as(w)))
  const perWriter = 15
  const expected = writers.length * perWriter

  const seen: { id: number, body: string }[] = []
  let last = '0'
  let writing = true
  const reading = (async () => {
    const deadline = Date.now() + 60_000
    while (seen.length < expected && Date.now() < deadline) {
      // Alternate instances and skip waiting while writers run, to read mid-stream often.
      const instance = seen.length % 2 === 0 ? app : other
      const res = await instance.inject({ method: 'GET', url: `/v2/events?after=${last}&limit=7&wait=${writing ? 0 : 2}`, headers: { authorization: reader.authorization } })
      const page = res.json() as { events: { id: string, data: { message: { body: string } } }[], last: string }
      for (const e of page.events) seen.push({ id: Number(e.id), body: e.data.message.body })
      last = page.last
      // A real reader has a network between it and the service; give the writers a turn
      // (PGlite answers from the same thread, in microtasks alone).
      await new Promise((resolve) => setImmediate(resolve))
    }
  })()

  await Promise.all(writers.map(async (w, i) => {
    for (let n = 0; n < perWriter; n++) {
      const instance = (i + n) % 2 === 0 ? app : other
      const res = await instance.inject({ method: 'POST', url: '/v2/message', headers: { authorization: w.authorization }, payload: { recipient: 'reader', body: `${w.address}:${n}` } })
      if (res.statusCode !== 200) throw new Error(res.body)
    }
  }))
  writing = false
  await reading

  t.equal(seen.length, expected, 'every event once')
  t.same(seen.map((e) => e.id), Array.from({ length: expected }, (_, i) => i + 1), 'in id order, with no gap')
  t.equal(new Set(seen.map((e) => e.body)).size, expected, 'no duplicates')
  for (const w of writers) {
    const own = seen.filter((e) => e.body.startsWith(`${w.address}:`)).map((e) => Number(e.body.split(':')[1]))
    t.same(own, Array.from({ length: perWriter }, (_, i) => i), `${w.address}'s messages in the order sent`)
  }
})

t.test('40 concurrent sends across two instances against a quota of 10 give exactly 10', async (t) => {
  const { app, as, db, secondInstance } = await build(t, { env: FAST })
  const other = await secondInstance()
  const alice = await as('alice', { dailyQuota: 10 })
  await as('bob')
  const answers = await Promise.all(Array.from({ length: 40 }, (_, i) =>
    (i % 2 === 0 ? app : other).inject({ method: 'POST', url: '/v2/message', headers: { authorization: alice.authorization }, payload: { recipient: 'bob', body: `n${i}` } })))
  const statuses = answers.map((a) => a.statusCode)
  t.equal(statuses.filter((s) => s === 200).length, 10)
  t.equal(statuses.filter((s) => s === 429).length, 30)
  t.ok(answers.filter((a) => a.statusCode === 429).every((a) => a.json().code === 'QUOTA_EXCEEDED'))
  const [row] = await queryRows<{ messages: number, quota: number }>(db, sql`
    SELECT (SELECT count(*) FROM messages WHERE sender = 'alice')::int AS messages,
           (SELECT count FROM quota_usage WHERE key_id = ${alice.keyId}) AS quota`)
  t.same(row, { messages: 10, quota: 10 })
})
