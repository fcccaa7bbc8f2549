import type { AddressInfo } from 'node:net'
import { setTimeout as sleep } from 'node:timers/promises'
import t from 'tap'
import { createKeysRepository } from '../../../src/modules/keys/keys.repository.js'
import { build } from '../../helper.js'
import { openStream } from '../../support/event-stream.js'
import { metric } from '../../support/metrics.js'
import { until } from '../../support/until.js'
import { webhooksSettled } from '../../support/webhook-dispatch.js'
import { startReceiver } from '../../support/webhook-receiver.js'

// API.md §9: a revoked key is "refused everywhere within 5 s"; an expired key and a deactivated
// user's keys answer 401. Everywhere includes what a key opened before: its event stream, its
// waiting long-poll and the webhook it registered. The stream and the poll run on a second
// instance, whose key cache nobody clears, while the admin acts on the first.
const ENV = { WEBHOOK_ALLOW_PRIVATE: 'true', RATE_LIMIT_PER_SECOND: '100000', EVENT_STREAM_HEARTBEAT_SECONDS: '1' }
const BOUND_MS = 5_000
// Events waiting for the webhook when the key goes, and how slowly the receiver takes each:
// together far longer than the bound, so a batch that runs on is seen.
const QUEUED = 10
const RECEIVER_DELAY_MS = 800
// An expiring key is given this much life once everything is open (an admin's update: the
// key then lapses by the clock alone, with no write at the moment it does).
const EXPIRES_AFTER_MS = 1_500

type Cause = 'revoked' | 'expired' | 'deactivated'

for (const cause of ['revoked', 'expired', 'deactivated'] as Cause[]) {
  t.test(`${cause === 'expired' ? 'an' : 'a'} ${cause} key's event stream, waiting long-poll and webhook all stop within 5 s, and nothing written after reaches them`, async (t) => {
    const built = await build(t, { env: ENV })
    const { as, db, callerFor, createUser } = built
    const other = await built.secondInstance()
    await other.listen({ port: 0, host: '127.0.0.1' })
    const base = `http://127.0.0.1:${(other.server.address() as AddressInfo).port}`
    const keys = createKeysRepository(db)
    const alice = await as('alice')
    await createUser('root')
    const admin = callerFor('root', await keys.create('root', null, { scopes: ['admin'] }))
    await createUser('bob')
    const bobKey = await keys.create('bob')
    const bob = callerFor('bob', bobKey)
    const group = (await alice.post('/v2/group', { name: 'ops', members: ['bob'] })).json().id as string

    const arrivals: { at: number, body: string }[] = []
    const receiver = await startReceiver(t, (_n, received) => { arrivals.push({ at: Date.now(), body: received.body }); return 200 }, RECEIVER_DELAY_MS)
    t.equal((await bob.post('/v2/webhooks', { url: receiver.url })).statusCode, 200, 'bob registers a webhook')
    const stream = await openStream(`${base}/v2/events/stream`, bob.authorization)
    t.teardown(() => stream.close())
    t.equal(stream.res.status, 200, 'bob opens a stream on the second instance')
    for (let i = 0; i < QUEUED; i++) t.equal((await alice.post('/v2/message', { recipient: 'bob', body: `before ${i}` })).statusCode, 200)
    t.ok(await stream.until(() => stream.received.filter((e) => e.event === 'message.received').length === QUEUED), 'the stream has them')
    await receiver.until(() => arrivals.length >= 1)
    const last = stream.received.at(-1)!.id
    const poll = fetch(`${base}/v2/events?after=${last}&wait=30`, { headers: { authorization: bob.authorization } })
      .then(async (res) => ({ status: res.status, body: await res.text(), at: Date.now() }))
    await until(async () => await metric(other, 'parley_long_polls_open') === 1, { message: 'the long-poll never waited' })

    let cutAt: number
    if (cause === 'revoked') {
      t.equal((await admin.delete(`/v2/admin/keys/${bobKey.keyId}`)).statusCode, 204)
      cutAt = Date.now()
    } else if (cause === 'deactivated') {
      t.equal((await admin.post('/v2/admin/users/bob', { deactivated: true })).statusCode, 200)
      cutAt = Date.now()
    } else {
      const expiresAt = Date.now() + EXPIRES_AFTER_MS
      t.equal((await admin.post(`/v2/admin/keys/${bobKey.keyId}`, { expiresAt: new Date(expiresAt).toISOString() })).statusCode, 200)
      // Lapsed by the database's clock: the key watch, the feed's reads and the webhook's
      // claims ask it (expires_at > now()), and no test moves that one.
      await sleep(expiresAt - Date.now())
      cutAt = expiresAt
    }
    // Written at once after: inside the 5 s the key cache may still trust the key. A message to
    // a deactivated user answers 403, so that case renames a group bob is in.
    if (cause === 'deactivated') {
      t.equal((await alice.post(`/v2/group/${group}`, { name: 'renamed after' })).statusCode, 200)
    } else {
      t.equal((await alice.post('/v2/message', { recipient: 'bob', body: 'written after' })).statusCode, 200)
    }

    const answer = await poll
    t.equal(answer.status, 401, `the waiting long-poll answers 401 (${answer.body.slice(0, 120)})`)
    t.ok(answer.at - cutAt < BOUND_MS, `after ${answer.at - cutAt} ms`)
    t.notMatch(answer.body, /after/, 'never with what was written after')

    await stream.until(() => stream.endedAt() !== undefined, BOUND_MS + 1_000)
    const ended = stream.endedAt()
    t.ok(ended !== undefined && ended - cutAt < BOUND_MS, `the stream is closed by the server within 5 s (${ended === undefined ? 'still open' : `${ended - cutAt} ms`})`)
    t.notOk(stream.received.some((e) => JSON.stringify(e.data).includes('after')), 'the stream never carried what was written after')

    // Deliveries in flight at the cut may finish; none may start 5 s or more after it: once
    // both instances' dispatchers have settled, nothing more can start.
    await webhooksSettled([built.app, other])
    const late = arrivals.filter((a) => a.at - cutAt >= BOUND_MS).map((a) => a.at - cutAt)
    t.same(late, [], 'no webhook delivery starts 5 s or more after the cut')
    t.notOk(arrivals.some((a) => a.body.includes('after')), 'the webhook never received what was written after')
    t.ok(arrivals.length < QUEUED, `the queued deliveries stopped (${arrivals.length} of ${QUEUED} sent)`)
    t.equal((await bob.get('/v2/whoami')).statusCode, 401, 'and the key itself answers 401')
  })
}
