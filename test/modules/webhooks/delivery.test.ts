import { randomBytes } from 'node:crypto'
import { once } from 'node:events'
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { sql } from 'drizzle-orm'
import t from 'tap'
import { backoffMs } from '../../../src/modules/webhooks/webhook-dispatcher.js'
import { createSecretBox } from '../../../src/modules/webhooks/webhook-secrets.js'
import { createWebhooksRepository, LeaseLost } from '../../../src/modules/webhooks/webhooks.repository.js'
import { build, type Caller } from '../../helper.js'
import { metric } from '../../support/metrics.js'
import { until } from '../../support/until.js'
import { webhooksSettled } from '../../support/webhook-dispatch.js'
import { startReceiver, validSignature } from '../../support/webhook-receiver.js'

// Webhook delivery to a real HTTP receiver on loopback (WEBHOOK_ALLOW_PRIVATE=true).
const ENV = { WEBHOOK_ALLOW_PRIVATE: 'true', RATE_LIMIT_PER_SECOND: '100000' }

interface Delivery { event: string, status: string, attempts: number, lastError: string | null }

/**
 * A webhook's delivery log once `done` holds of it (it is written as each batch ends), or as it
 * stands after 10 s, for the test's own assertion to show.
 */
async function logUntil (owner: Caller, id: string, done: (deliveries: Delivery[]) => boolean): Promise<Delivery[]> {
  let deliveries: Delivery[] = []
  await until(async () => done(deliveries = (await owner.get(`/v2/webhooks/${id}/deliveries?limit=100`)).json().deliveries), { intervalMs: 50 })
    .catch(() => {})
  return deliveries
}

t.test('every event of the feed, in order, signed, with the Event JSON as the body', async (t) => {
  const { as } = await build(t, { env: ENV })
  const receiver = await startReceiver(t)
  const alice = await as('alice')
  const bob = await as('bob')
  const before = await bob.post('/v2/message', { recipient: 'alice', body: 'before the webhook' })
  t.equal(before.statusCode, 200)
  const hook = (await alice.post('/v2/webhooks', { url: receiver.url })).json()

  for (let i = 0; i < 20; i++) t.equal((await bob.post('/v2/message', { recipient: 'alice', body: `hello ${i}` })).statusCode, 200)
  await receiver.until(() => receiver.delivered().length >= 20)

  const feed = (await alice.get('/v2/events?limit=100')).json().events as { id: string }[]
  const sent = receiver.delivered()
  t.same(sent.map((r) => r.event.id), feed.slice(1).map((e) => e.id), 'every event after the webhook was made, in id order, each once')
  t.same(sent.map((r) => r.event), feed.slice(1), 'each body is the Event, as GET /v2/events shows it')
  t.ok(sent.every((r) => validSignature(hook.secret, r.headers['x-parley-signature'], r.body)), 'every signature verifies with the secret')
  t.notOk(validSignature('whsec_someone-else', sent[0]!.headers['x-parley-signature'], sent[0]!.body), 'and not with another')
  t.ok(sent.every((r) => r.headers['x-parley-event-id'] === r.event.id && r.headers['x-parley-webhook-id'] === hook.id), 'X-Parley-Event-Id and X-Parley-Webhook-Id')
  t.ok(sent.every((r) => r.headers['content-type'] === 'application/json'))
  t.match(sent[0]!.event, { type: 'message.received', data: { message: { body: 'hello 0', sender: 'bob' } } })

  // The log is written as each batch ends, just after the receiver has answered.
  let log = (await alice.get(`/v2/webhooks/${hook.id}/deliveries?limit=5`)).json()
  await until(async () => {
    log = (await alice.get(`/v2/webhooks/${hook.id}/deliveries?limit=5`)).json()
    return log.deliveries[0]?.event === feed.at(-1)!.id
  }, { timeoutMs: 5_000, intervalMs: 50, message: 'the log never reached the last event' })
  t.equal(log.deliveries.length, 5)
  t.same(log.deliveries.map((d: { event: string }) => d.event), feed.slice(-5).map((e) => e.id).reverse(), 'the log, newest first')
  t.match(log.deliveries[0], { status: 'delivered', attempts: 1, lastError: null })
  const rest = (await alice.get(`/v2/webhooks/${hook.id}/deliveries?limit=100&cursor=${log.nextCursor}`)).json()
  t.equal(rest.deliveries.length, 15, 'the next page holds the rest')
  t.equal(rest.nextCursor, null)
})

t.test('a filter sends only its types', async (t) => {
  const { app, as } = await build(t, { env: ENV })
  const receiver = await startReceiver(t)
  const alice = await as('alice')
  const bob = await as('bob')
  await alice.post('/v2/webhooks', { url: receiver.url, events: ['message.status'] })
  const sent = await alice.post('/v2/message', { recipient: 'bob', body: 'read me' })
  t.equal((await bob.post('/v2/message/typing', { recipient: 'alice' })).statusCode, 204)
  t.equal((await bob.post('/v2/message/status', { message: sent.json().id, status: 'read' })).statusCode, 204)
  await receiver.until(() => receiver.received.length >= 1)
  await webhooksSettled([app])
  t.same(receiver.received.map((r) => r.event.type), ['message.status'], 'only the status event, not typing')
  t.match(receiver.received[0]!.event.data, { message: sent.json().id, recipient: 'bob', status: 'read' })
})

t.test('a receiver that fails for a while gets every event later, in order; the log shows the retries', async (t) => {
  const { as } = await build(t, { env: ENV })
  // The first three requests fail (500, 503, 404), then it recovers.
  const receiver = await startReceiver(t, (n) => [500, 503, 404][n] ?? 200)
  const alice = await as('alice')
  const bob = await as('bob')
  const hook = (await alice.post('/v2/webhooks', { url: receiver.url })).json()
  for (let i = 0; i < 5; i++) await bob.post('/v2/message', { recipient: 'alice', body: `m${i}` })
  await receiver.until(() => receiver.delivered().length >= 5, 30_000)
  const feed = (await alice.get('/v2/events')).json().events as { id: string }[]
  t.same(receiver.delivered().map((r) => r.event.id), feed.map((e) => e.id), 'all five, in order, after the failures')
  t.same(receiver.received.slice(0, 4).map((r) => r.event.id), Array(4).fill(feed[0]!.id), 'the first event was tried until it went through; nothing overtook it')
  const log = await logUntil(alice, hook.id, (deliveries) => deliveries.length === 5)
  t.match(log.at(-1), { event: feed[0]!.id, status: 'delivered', attempts: 4, lastError: 'answered 404' })
})

t.test('after 24 h of failures the webhook is disabled and its owner told', async (t) => {
  const { app, as, db } = await build(t, { env: ENV })
  const receiver = await startReceiver(t, () => 500)
  const alice = await as('alice')
  const bob = await as('bob')
  const hook = (await alice.post('/v2/webhooks', { url: receiver.url })).json()
  const other = (await alice.post('/v2/webhooks', { url: `${receiver.url}/other`, events: ['webhook.disabled'] })).json()
  await bob.post('/v2/message', { recipient: 'alice', body: 'never arrives' })
  await receiver.until(() => receiver.received.length >= 1)
  // As if the first failure had been a day ago: the next failure is the last. (Once the batch
  // that failed has recorded it and let go of the webhook.)
  await until(async () => {
    const updated = await db.execute(sql`UPDATE webhooks SET failing_since = now() - interval '24 hours 1 second', next_attempt_at = now()
      WHERE id = ${hook.id} AND lease_until IS NULL AND failing_since IS NOT NULL RETURNING id`) as unknown as { rows: unknown[] }
    return updated.rows.length === 1
  }, { timeoutMs: 5_000, intervalMs: 50, message: 'the failed batch never let go of the webhook' })
  const n = receiver.received.length
  await receiver.until(() => receiver.received.some((r, i) => i >= n && r.headers['x-parley-webhook-id'] === hook.id))
  let listed: { id: string, disabledAt: string | null }[] = []
  await until(async () => {
    listed = (await alice.get('/v2/webhooks')).json().webhooks
    return Boolean(listed.find((w) => w.id === hook.id)?.disabledAt)
  }, { timeoutMs: 5_000, intervalMs: 50, message: 'the webhook was never disabled' })
  t.ok(listed.find((w) => w.id === hook.id)?.disabledAt, 'disabledAt is set')
  const feed = (await alice.get('/v2/events')).json().events as { type: string, data: unknown }[]
  t.same(feed.filter((e) => e.type === 'webhook.disabled').map((e) => e.data), [{ webhook: hook.id }], 'webhook.disabled is in the feed')
  t.match(await logUntil(alice, hook.id, (d) => d[0]?.status === 'failed'), [{ status: 'failed', lastError: 'answered 500' }])
  const count = receiver.received.filter((r) => r.headers['x-parley-webhook-id'] === hook.id).length
  // Every look for due webhooks from here on passes it by, and none is sending to it.
  await webhooksSettled([app])
  t.equal(receiver.received.filter((r) => r.headers['x-parley-webhook-id'] === hook.id).length, count, 'a disabled webhook is sent nothing more')
  t.ok(other.id)
})

t.test('redeliver sends an event again, with its own id; an event the feed does not hold is a 404', async (t) => {
  const { as } = await build(t, { env: ENV })
  const receiver = await startReceiver(t)
  const alice = await as('alice')
  const bob = await as('bob')
  const hook = (await alice.post('/v2/webhooks', { url: receiver.url })).json()
  await bob.post('/v2/message', { recipient: 'alice', body: 'once more' })
  await receiver.until(() => receiver.received.length >= 1)
  const id = receiver.received[0]!.event.id
  t.equal((await alice.post(`/v2/webhooks/${hook.id}/redeliver`, { event: id })).statusCode, 204)
  await receiver.until(() => receiver.received.length >= 2)
  t.same(receiver.received.map((r) => r.event.id), [id, id], 'the same event, twice')
  t.equal(receiver.received[1]!.body, receiver.received[0]!.body, 'the same body')
  const missing = await alice.post(`/v2/webhooks/${hook.id}/redeliver`, { event: '999999' })
  t.equal(missing.statusCode, 404)
  t.match(missing.json(), { code: 'NOT_FOUND', message: 'event 999999 not found' })
  t.match(await logUntil(alice, hook.id, (d) => d[0]?.attempts === 2), [{ event: id, status: 'delivered', attempts: 2 }])
})

t.test('two instances share the webhooks: no event is delivered twice', async (t) => {
  const { app, as, secondInstance } = await build(t, { env: ENV })
  const other = await secondInstance(ENV)
  const receiver = await startReceiver(t)
  const bob = await as('bob')
  const owners = await Promise.all(['u1', 'u2', 'u3', 'u4'].map((a) => as(a)))
  for (const owner of owners) await owner.post('/v2/webhooks', { url: receiver.url })
  for (let i = 0; i < 15; i++) {
    await Promise.all(owners.map((o) => bob.post('/v2/message', { recipient: o.address, body: `m${i}` })))
  }
  await receiver.until(() => receiver.received.length >= 60)
  await webhooksSettled([app, other])
  const keys = receiver.received.map((r) => `${r.headers['x-parley-webhook-id']}/${r.event.id}`)
  t.equal(keys.length, 60, '60 deliveries')
  t.equal(new Set(keys).size, 60, 'each event once')
  for (const webhookId of new Set(receiver.received.map((r) => r.headers['x-parley-webhook-id']))) {
    const ids = receiver.received.filter((r) => r.headers['x-parley-webhook-id'] === webhookId).map((r) => Number(r.event.id))
    t.same(ids, [...ids].sort((a, b) => a - b), `${String(webhookId)}: in id order`)
  }
})

t.test('backoff roughly doubles with the time failing, with jitter, up to an hour', async (t) => {
  t.equal(backoffMs(0, () => 0.5), 1_000)
  t.equal(backoffMs(8_000, () => 0.5), 8_000)
  t.equal(backoffMs(10 * 3600_000, () => 0.5), 3600_000)
  t.equal(backoffMs(8_000, () => 0), 6_400)
  t.equal(backoffMs(8_000, () => 1), 9_600)
})

t.test('with WEBHOOK_SECRETS_KEY the database holds only sealed secrets, and deliveries are still signed', async (t) => {
  const key = randomBytes(32).toString('hex')
  const { as, db, logs } = await build(t, { env: { ...ENV, WEBHOOK_SECRETS_KEY: key } })
  const receiver = await startReceiver(t)
  const alice = await as('alice')
  const bob = await as('bob')
  const hook = (await alice.post('/v2/webhooks', { url: receiver.url })).json()
  const [row] = (await db.execute(sql`SELECT secret FROM webhooks WHERE id = ${hook.id}`) as unknown as { rows: { secret: string }[] }).rows
  t.match(row!.secret, /^sealed:v1:/, 'stored sealed')
  t.notMatch(row!.secret, hook.secret.slice(6), 'no part of the secret in clear')
  await bob.post('/v2/message', { recipient: 'alice', body: 'sealed' })
  await receiver.until(() => receiver.received.length >= 1)
  t.ok(validSignature(hook.secret, receiver.received[0]!.headers['x-parley-signature'], receiver.received[0]!.body), 'signed with the secret shown once')
  t.notMatch(logs(), hook.secret, 'the secret is in no log line')
  t.notMatch(logs(), 'stored unsealed')
})

t.test('without the key, secrets are stored as they are and the log says so once', async (t) => {
  const { as, logs } = await build(t, { env: ENV })
  const alice = await as('alice')
  const hooks = [await alice.post('/v2/webhooks', { url: 'http://127.0.0.1:9/a' }), await alice.post('/v2/webhooks', { url: 'http://127.0.0.1:9/b' })]
  t.equal(logs().split('stored unsealed').length - 1, 1, 'one warning')
  for (const hook of hooks) t.notMatch(logs(), hook.json().secret)
})

t.test('a sealed secret opens only with its key and for its own webhook', async (t) => {
  const box = createSecretBox(randomBytes(32))
  const sealed = box.seal('whk_a', 'whsec_x')
  t.equal(box.open('whk_a', sealed), 'whsec_x')
  t.throws(() => box.open('whk_b', sealed), /another WEBHOOK_SECRETS_KEY/, 'moved to another webhook\'s row, it does not open')
  t.throws(() => createSecretBox(randomBytes(32)).open('whk_a', sealed), /another WEBHOOK_SECRETS_KEY/)
  t.throws(() => createSecretBox(undefined).open('whk_a', sealed), /WEBHOOK_SECRETS_KEY is not set/)
  t.equal(createSecretBox(undefined).open('whk_a', 'whsec_plain'), 'whsec_plain', 'an unsealed one reads as it is')
  t.not(box.seal('whk_a', 'whsec_x'), sealed, 'each seal has its own IV')
})

t.test('a kept-alive connection the receiver dropped is retried on a new one, not counted as a failure', async (t) => {
  const { as } = await build(t, { env: ENV })
  // Answers the first request on each connection, and drops the connection at the second.
  const bodies: string[] = []
  const server = createServer((req, res) => {
    const socket = req.socket as typeof req.socket & { served?: boolean }
    if (socket.served === true) { socket.destroy(); return }
    socket.served = true
    let body = ''
    req.setEncoding('utf8').on('data', (c: string) => { body += c }).on('end', () => { bodies.push(body); res.writeHead(200, { connection: 'keep-alive' }).end() })
  })
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  t.teardown(() => { server.closeAllConnections(); server.close() })
  const alice = await as('alice')
  const bob = await as('bob')
  const hook = (await alice.post('/v2/webhooks', { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/` })).json()
  for (let i = 0; i < 5; i++) await bob.post('/v2/message', { recipient: 'alice', body: `r${i}` })
  const log = await logUntil(alice, hook.id, (d) => d.length === 5 && d.every((x) => x.status === 'delivered'))
  t.equal(bodies.length, 5, 'each event arrived once')
  t.same(log.map((d) => d.attempts), [1, 1, 1, 1, 1], 'each on its first attempt')
  t.same(log.map((d) => d.lastError), [null, null, null, null, null])
})

t.test('a redelivery asked while the event still fails waits its turn: the event goes out in order, then once more; the webhook moves on', async (t) => {
  const { app, as } = await build(t, { env: ENV })
  let failing = true
  const receiver = await startReceiver(t, () => failing ? 500 : 200)
  const alice = await as('alice')
  const bob = await as('bob')
  const hook = (await alice.post('/v2/webhooks', { url: receiver.url })).json()
  for (let i = 0; i < 3; i++) await bob.post('/v2/message', { recipient: 'alice', body: `w${i}` })
  await receiver.until(() => receiver.received.length >= 1)
  const first = receiver.received[0]!.event.id
  t.equal((await alice.post(`/v2/webhooks/${hook.id}/redeliver`, { event: first })).statusCode, 204, 'asked while it fails')
  failing = false
  await receiver.until(() => receiver.delivered().length >= 3, 30_000)
  await webhooksSettled([app])
  const ids = receiver.delivered().map((r) => r.event.id)
  const firsts = [...new Set(ids)]
  t.same(firsts, [...firsts].sort((a, b) => Number(a) - Number(b)), 'first deliveries in order')
  t.equal(firsts.length, 3, 'every event')
  t.same(ids.filter((id) => id === first).length, 2, 'the one asked for: twice')
  t.equal(ids.length, 4, 'the others once')
  await bob.post('/v2/message', { recipient: 'alice', body: 'after' })
  await receiver.until(() => receiver.delivered().length >= 4)
  t.pass('and the webhook carries on')
})

t.test('a redelivery asked for an event the feed then loses is not retried for ever', async (t) => {
  const { app, as, db } = await build(t, { env: ENV })
  let failing = false
  const receiver = await startReceiver(t, () => failing ? 500 : 200)
  const alice = await as('alice')
  const bob = await as('bob')
  const hook = (await alice.post('/v2/webhooks', { url: receiver.url })).json()
  await bob.post('/v2/message', { recipient: 'alice', body: 'soon gone' })
  await receiver.until(() => receiver.delivered().length >= 1)
  await logUntil(alice, hook.id, (d) => d[0]?.status === 'delivered')
  failing = true
  t.equal((await alice.post(`/v2/webhooks/${hook.id}/redeliver`, { event: receiver.received[0]!.event.id })).statusCode, 204)
  await receiver.until(() => receiver.received.length >= 2)
  // The feed loses it (retention: 30 days, or every key acknowledged it; DELETE /v2/events only
  // acknowledges it for the calling key).
  await db.execute(sql`DELETE FROM events WHERE address = 'alice'`)
  await db.execute(sql`UPDATE webhooks SET next_attempt_at = now() WHERE id = ${hook.id}`)
  const count = receiver.received.length
  // No claim finds work in it: the webhook is never leased again (before, it was claimed,
  // found nothing, released and claimed again, without a pause). It is due: every look for
  // due webhooks from here on would start a batch for it.
  const batches = await metric(app, 'parley_webhook_batches_total')
  await webhooksSettled([app])
  t.equal(await metric(app, 'parley_webhook_batches_total'), batches, 'never claimed again')
  t.equal(receiver.received.length, count, 'and nothing more is sent')
})

t.test('a disabled webhook cannot be asked to redeliver (409)', async (t) => {
  const { as, db } = await build(t, { env: ENV })
  const alice = await as('alice')
  const hook = (await alice.post('/v2/webhooks', { url: 'http://127.0.0.1:9/' })).json()
  await db.execute(sql`UPDATE webhooks SET disabled_at = now() WHERE id = ${hook.id}`)
  const res = await alice.post(`/v2/webhooks/${hook.id}/redeliver`, { event: '1' })
  t.equal(res.statusCode, 409)
  t.match(res.json(), { code: 'CONFLICT', message: /is disabled/ })
})

t.test('a holder whose lease was taken records nothing', async (t) => {
  const { as, db } = await build(t, { env: ENV })
  const alice = await as('alice')
  const hook = (await alice.post('/v2/webhooks', { url: 'http://127.0.0.1:9/' })).json()
  const repository = createWebhooksRepository(db)
  const row = (await repository.get('alice', hook.id))!
  // Held by claim "b"; the caller thinks it holds claim "a".
  await db.execute(sql`UPDATE webhooks SET lease_token = 'b', lease_until = now() + interval '30 seconds' WHERE id = ${hook.id}`)
  const progress = { deliveredThrough: 99, redelivered: [], nextAttemptAt: new Date(), failingSince: null }
  const lost = await repository.record({ ...row, leaseToken: 'a' }, [{ eventId: 99, delivered: true, error: null, at: new Date() }], progress).then(() => undefined, (err: unknown) => err)
  t.ok(lost instanceof LeaseLost, `it throws LeaseLost (${String(lost)})`)
  const after = (await repository.get('alice', hook.id))!
  t.equal(after.deliveredThrough, row.deliveredThrough, 'no progress recorded')
  t.equal(after.leaseToken, 'b', 'the other claim still holds it')
  t.same(await repository.deliveries(hook.id, 10, undefined), [], 'no log row')
  await repository.record({ ...row, leaseToken: 'b' }, [], progress)
  t.equal((await repository.get('alice', hook.id))!.deliveredThrough, 99, 'the holder records')
})

t.test('secrets stored before a key was set are sealed once one is', async (t) => {
  const { as, db } = await build(t, { env: ENV })
  const alice = await as('alice')
  const hook = (await alice.post('/v2/webhooks', { url: 'http://127.0.0.1:9/' })).json()
  const box = createSecretBox(randomBytes(32))
  t.equal(await createWebhooksRepository(db).sealUnsealed((id, secret) => box.seal(id, secret)), 1)
  const stored = (await createWebhooksRepository(db).get('alice', hook.id))!.secret
  t.match(stored, /^sealed:v1:/)
  t.equal(box.open(hook.id, stored), hook.secret, 'and open to the secret shown at creation')
  t.equal(await createWebhooksRepository(db).sealUnsealed((id, secret) => box.seal(id, secret)), 0, 'sealed ones are left alone')
})

t.test('a receiver that answers 200 and never ends its body has each event delivered once, well within the 10 s', async (t) => {
  const { app, as } = await build(t, { env: ENV })
  const receiver = await startReceiver(t, () => 200, 0, { neverEndBody: true })
  const alice = await as('alice')
  const bob = await as('bob')
  const hook = (await alice.post('/v2/webhooks', { url: receiver.url })).json()
  const started = Date.now()
  for (let i = 0; i < 3; i++) t.equal((await bob.post('/v2/message', { recipient: 'alice', body: `endless ${i}` })).statusCode, 200)
  await receiver.until(() => receiver.received.length >= 3, 8_000)
  const log = await logUntil(alice, hook.id, (d) => d.length === 3 && d.every((x) => x.status === 'delivered'))
  const took = Date.now() - started
  t.same(log.map((d) => [d.status, d.attempts, d.lastError]), [['delivered', 1, null], ['delivered', 1, null], ['delivered', 1, null]], `delivered on the first attempt (${took} ms)`)
  t.ok(took < 8_000, `all three delivered in ${took} ms, not one per 10 s deadline`)
  // Past the drain bound (1 s), when the sender has cut each connection, nothing is sent again.
  await until(() => receiver.connections() === 0, { timeoutMs: 5_000, message: 'the sender never cut the bodies that do not end' })
  await webhooksSettled([app])
  t.equal(receiver.received.length, 3, 'each event arrived once')
})
