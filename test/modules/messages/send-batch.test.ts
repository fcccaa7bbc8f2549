import { and, asc, eq, sql } from 'drizzle-orm'
import http from 'node:http'
import pg from 'pg'
import t, { type Test } from 'tap'
import { queryRows } from '../../../src/db/rows.js'
import type { Principal } from '../../../src/modules/keys/authenticator.js'
import { eventDataJson, toEvent } from '../../../src/modules/events/events.repository.js'
import { events } from '../../../src/modules/events/events.table.js'
import { sealEarly, writeBatch, type BatchSend } from '../../../src/modules/messages/send-batch.repository.js'
import { openedBody } from '../../../src/modules/messages/message-body.js'
import { createSendService, type SendResult } from '../../../src/modules/messages/send.service.js'
import { installKeyring, keyring, Keyring, parseSealingKeys } from '../../../src/sealing/keyring.js'
import { build, type Built } from '../../helper.js'
import { usingPostgres } from '../../support/databases.js'
import { TEST_SEALING_KEYS } from '../../support/sealing.js'
import { until } from '../../support/until.js'

/**
 * Commit coalescing (issue #15): sends written together by one statement each keep their own
 * outcome. A refusal (quota, unknown or deactivated recipient, an Idempotency-Key replay or
 * one in flight) fails and delays no other send of the batch, and the quota stays exact.
 */

const FAST = { RATE_LIMIT_PER_SECOND: '100000' }

async function principal (built: Built, address: string, dailyQuota: number): Promise<Principal> {
  const caller = await built.as(address, { dailyQuota })
  return { keyId: caller.keyId, address, dailyQuota, scopes: ['read', 'send'] }
}

function send (p: Principal, recipient: string, n: number, extra: Partial<BatchSend> = {}): BatchSend {
  const messageId = `msg_batch_${p.address}_${n}`
  const message = { id: messageId, sender: p.address, recipient, body: `#${n}`, attachments: [], createdAt: '', editedAt: null, replyTo: null, reactions: [] }
  return { keyId: p.keyId, limit: p.dailyQuota, sender: p.address, recipient, messageId, body: `#${n}`, replyTo: null, eventData: eventDataJson('message.received', { message }), files: [], toGroup: false, ...extra }
}

/** What each settled promise was: its status code, or 200 with the message. */
async function outcomes (sends: Promise<SendResult>[]): Promise<(number | SendResult)[]> {
  const settled = await Promise.allSettled(sends)
  return settled.map((s) => s.status === 'fulfilled' ? s.value : (s.reason as { statusCode?: number }).statusCode ?? 500)
}

/** A feed's message events: id and body. */
async function feed (built: Built, address: string): Promise<{ seq: number, body: string }[]> {
  const rows = await built.db.select().from(events)
    .where(and(eq(events.address, address), eq(events.type, 'message.received'))).orderBy(asc(events.seq))
  return rows.map((row) => {
    const event = toEvent(row)
    return { seq: row.seq, body: event.type === 'message.received' ? event.data.message.body : '' }
  })
}

/** Every event id of a feed, in order. */
async function ids (built: Built, address: string): Promise<number[]> {
  return (await queryRows<{ seq: number }>(built.db, sql`SELECT seq::int AS seq FROM events WHERE address = ${address} ORDER BY seq`)).map((r) => r.seq)
}

t.test('one statement: each send of a batch gets its own outcome, and only the good ones are written', async (t) => {
  const built = await build(t, { env: FAST })
  const alice = await principal(built, 'alice', 100)
  const carol = await principal(built, 'carol', 0)
  const dave = await principal(built, 'dave', 2)
  await built.createUser('bob')
  await built.createUser('gone')
  await built.db.execute(sql`UPDATE users SET deactivated_at = now() WHERE address = 'gone'`)

  const batch = [
    send(alice, 'bob', 1),
    send(alice, 'nobody', 2), // no such user
    send(alice, 'gone', 3), // deactivated
    send(carol, 'bob', 4), // quota 0: over quota
    send(dave, 'bob', 5), send(dave, 'bob', 6), send(dave, 'bob', 7), // three of one key, two left: counted none, retried alone by the caller
    send(alice, 'bob', 8)
  ]
  const out = await writeBatch(built.db, batch)
  t.same(out.map((o) => [o.found, o.deactivated, o.written]), [
    [true, false, true], [false, false, false], [true, true, false], [true, false, false],
    [true, false, false], [true, false, false], [true, false, false], [true, false, true]
  ])
  t.same(out.map((o) => o.used), [1, null, null, null, null, null, null, 2], 'alice counted twice, in order; no one else')
  t.same(out.map((o) => o.keySends), [2, 0, 0, 1, 3, 3, 3, 2])
  t.equal(new Set(out.map((o) => o.createdAt)).size, 1, 'one statement, one clock')

  const quota = await queryRows<{ key_id: string, count: number }>(built.db, sql`SELECT key_id, count FROM quota_usage ORDER BY count`)
  t.same(quota.map((q) => [q.key_id, q.count]), [[alice.keyId, 2]], 'only counted sends count; a refused key has no row')
  t.same(await feed(built, 'bob'), [{ seq: 1, body: '#1' }, { seq: 2, body: '#8' }], "bob's feed: consecutive ids, in batch order")
  const [{ n }] = await queryRows<{ n: number }>(built.db, sql`SELECT count(*)::int AS n FROM messages`) as [{ n: number }]
  t.equal(n, 2)
})

t.test('a send of no key (the test bot\'s reply) is written beside counted ones and counts for no one', async (t) => {
  const built = await build(t, { env: FAST })
  const alice = await principal(built, 'alice', 100)
  await built.createUser('bob')
  await built.createUser('gone')
  await built.db.execute(sql`UPDATE users SET deactivated_at = now() WHERE address = 'gone'`)
  const out = await writeBatch(built.db, [
    send(alice, 'bob', 1),
    send(alice, 'bob', 2, { keyId: null, limit: 0 }),
    send(alice, 'gone', 3, { keyId: null, limit: 0 })
  ])
  t.same(out.map((o) => [o.written, o.used, o.keySends]), [[true, 1, 1], [true, null, 0], [false, null, 0]])
  const quota = await queryRows<{ key_id: string, count: number }>(built.db, sql`SELECT key_id, count FROM quota_usage`)
  t.same(quota.map((q) => [q.key_id, q.count]), [[alice.keyId, 1]], 'only the keyed send counts')
  t.same(await feed(built, 'bob'), [{ seq: 1, body: '#1' }, { seq: 2, body: '#2' }], 'both reach the feed, in order')
})

t.test('fired at once, sends coalesce: a key past its quota loses only what does not fit, exactly', async (t) => {
  const built = await build(t, { env: FAST })
  const batches: number[] = []
  const service = createSendService(built.db, { concurrency: 1, onBatch: (size) => batches.push(size) })
  const tight = await principal(built, 'tight', 5)
  const free = await principal(built, 'free', 1000)
  await built.createUser('bob')
  const input = (p: Principal, recipient: string, body: string) => ({ principal: p, recipient, body, files: [] })

  const sends: Promise<SendResult>[] = []
  for (let i = 0; i < 8; i++) sends.push(service.send(input(tight, 'bob', `tight ${i}`)))
  for (let i = 0; i < 8; i++) sends.push(service.send(input(free, 'bob', `free ${i}`)))
  sends.push(service.send(input(free, 'nobody', 'lost')))
  const out = await outcomes(sends)

  t.ok(batches.some((size) => size > 1), `sends were written together (batches: ${batches.join(', ')})`)
  const tightOut = out.slice(0, 8)
  t.equal(tightOut.filter((o) => typeof o !== 'number').length, 5, 'five of eight fit a quota of five')
  t.same(tightOut.filter((o) => typeof o === 'number'), [429, 429, 429])
  const used = tightOut.flatMap((o) => typeof o === 'number' ? [] : [o.quota.used]).sort((a, b) => a - b)
  t.same(used, [1, 2, 3, 4, 5], "each counted send reports its own place in the key's day")
  t.ok(out.slice(8, 16).every((o) => typeof o !== 'number'), "the other key's sends all went, untouched by the refusals")
  t.equal(out[16], 404, 'an unknown recipient is 404 alone')

  const bob = await feed(built, 'bob')
  t.equal(bob.length, 13)
  t.same(bob.map((e) => e.seq), Array.from({ length: 13 }, (_, i) => i + 1), 'no skipped or repeated event ids')
  const [{ count }] = await queryRows<{ count: number }>(built.db, sql`SELECT count FROM quota_usage WHERE key_id = ${tight.keyId}`) as [{ count: number }]
  t.equal(count, 5, 'the quota row says exactly what was sent')
})

t.test('a send with an Idempotency-Key never shares a batch with its own key\'s other sends', async (t) => {
  // Its quota is then asked alone, never in an all-or-nothing group that would be retried in a
  // later transaction, after its Idempotency-Key lock was let go.
  const built = await build(t, { env: FAST })
  const batches: number[] = []
  const service = createSendService(built.db, { concurrency: 1, onBatch: (size) => batches.push(size) })
  const tight = await principal(built, 'tight', 2)
  await built.createUser('bob')
  const input = (body: string, idempotencyKey?: string) => ({ principal: tight, recipient: 'bob', body, files: [], idempotencyKey })
  const out = await outcomes([service.send(input('a')), service.send(input('b')), service.send(input('c', 'k-1'))])
  t.same(batches, [1, 1, 1], 'the keyed send waited for a batch of its own')
  t.same(out.map((o) => typeof o === 'number' ? o : 200), [200, 200, 429], 'a quota of two: the third send is refused, exactly')
  const [{ n }] = await queryRows<{ n: number }>(built.db, sql`SELECT count(*)::int AS n FROM idempotency_keys`) as [{ n: number }]
  t.equal(n, 0, 'a refused send records no Idempotency-Key')
})

t.test('group sends coalesce: each member gets consecutive feed ids, non-members and unknown groups refuse alone', async (t) => {
  const built = await build(t, { env: FAST })
  const batches: number[] = []
  const service = createSendService(built.db, { concurrency: 1, onBatch: (size) => batches.push(size) })
  const alice = await built.as('alice')
  const mallory = await principal(built, 'mallory', 100)
  await built.createUser('bob')
  await built.createUser('carol')
  await built.createUser('dan')
  const created = await alice.post('/v2/group', { name: 'team', members: ['alice', 'bob', 'carol', 'dan'] })
  t.equal(created.statusCode, 200)
  const group = created.json().id as string
  await built.db.execute(sql`UPDATE users SET deactivated_at = now() WHERE address = 'dan'`)
  const sender = { keyId: alice.keyId, address: 'alice', dailyQuota: 1000, scopes: ['read', 'send'] } as Principal
  const input = (p: Principal, recipient: string, body: string) => ({ principal: p, recipient, body, files: [] })

  const sends: Promise<SendResult>[] = []
  for (let i = 0; i < 6; i++) sends.push(service.send(input(sender, group, `to the team ${i}`)))
  sends.push(service.send(input(mallory, group, 'let me in')))
  sends.push(service.send(input(sender, 'grp_00000000000000000000000000', 'nowhere')))
  sends.push(service.send(input(sender, 'bob', 'just bob')))
  const out = await outcomes(sends)

  t.ok(batches.some((size) => size > 1), `group sends were written together (batches: ${batches.join(', ')})`)
  t.ok(out.slice(0, 6).every((o) => typeof o !== 'number'), 'every member send went')
  t.same(out.slice(6, 8), [403, 404], 'a non-member and an unknown group refuse alone')
  t.not(typeof out[8], 'number', 'the 1:1 send went too')
  const bob = await feed(built, 'bob')
  t.equal(bob.length, 7)
  const bobIds = await ids(built, 'bob')
  t.same(bobIds, Array.from({ length: bobIds.length }, (_, i) => i + 1), "bob's feed: no skipped or repeated ids")
  t.same(bob.filter((e) => e.body.startsWith('to the team')).map((e) => e.body), Array.from({ length: 6 }, (_, i) => `to the team ${i}`), 'in send order')
  t.equal((await feed(built, 'carol')).length, 6)
  const carolIds = await ids(built, 'carol')
  t.same(carolIds, Array.from({ length: carolIds.length }, (_, i) => i + 1))
  t.same(await feed(built, 'dan'), [], 'a deactivated member receives nothing')
  t.same(await feed(built, 'alice'), [], 'nor does the sender')
  const [{ n }] = await queryRows<{ n: number }>(built.db, sql`
    SELECT count(*)::int AS n FROM deliveries d JOIN messages m ON m.id = d.message_id WHERE m.recipient = ${group}`) as [{ n: number }]
  t.equal(n, 12, 'a delivery row per member and message')
})

t.test('a send sealed before it queued is written under the key active when its batch is written', async (t) => {
  const built = await build(t, { env: FAST })
  const alice = await principal(built, 'alice', 100)
  await built.createUser('bob')
  const configured = keyring()
  t.teardown(() => installKeyring(configured))
  const rotated = new Keyring(parseSealingKeys(`k9:${'a7'.repeat(32)},${TEST_SEALING_KEYS}`))
  const early = send(alice, 'bob', 1)
  const kept = send(alice, 'bob', 2)
  sealEarly(early)
  sealEarly(kept)
  // The active key changes between the first send's sealing and its batch; not for the second.
  installKeyring(rotated)
  await writeBatch(built.db, [early])
  installKeyring(configured)
  await writeBatch(built.db, [kept])

  installKeyring(rotated) // opens both keys' records
  const rows = await queryRows<{ id: string, body: string, sealed_by: string, event_sealed_by: string }>(built.db, sql`
    SELECT m.id, m.body, m.sealed_by, e.sealed_by AS event_sealed_by FROM messages m JOIN events e ON e.message_id = m.id ORDER BY m.id`)
  t.same(rows.map((r) => [r.sealed_by, r.event_sealed_by]), [['k9', 'k9'], ['test', 'test']], 'each under the key active at its write, body and event alike')
  t.same(rows.map((r) => openedBody({ id: r.id, body: r.body, sealedBy: r.sealed_by })), ['#1', '#2'], 'and each opens to what was sent')
  t.same((await feed(built, 'bob')).map((e) => e.body), ['#1', '#2'], 'the events open too')
})

t.test('files ride in the batch: small ones whole, large ones claimed from staging, every byte read back', async (t) => {
  const built = await build(t, { env: FAST })
  const alice = await built.as('alice')
  await built.createUser('bob')
  const small = Buffer.alloc(10 * 1024, 7)
  const large = Buffer.from(Array.from({ length: 300 * 1024 }, (_, i) => i % 251))
  const form = (body: string, files: [string, Buffer][]) => {
    const f = new FormData()
    f.append('recipient', 'bob')
    f.append('body', body)
    for (const [name, bytes] of files) f.append('attachment', new Blob([new Uint8Array(bytes)], { type: 'image/png' }), name)
    return f
  }
  const lost = form('lost', [['c.png', small]])
  lost.set('recipient', 'nobody')
  const answers = await Promise.all([
    alice.post('/v2/message', form('small', [['a.png', small]])),
    alice.post('/v2/message', { recipient: 'bob', body: 'plain' }),
    alice.post('/v2/message', form('large and empty', [['b.png', large], ['empty.png', Buffer.alloc(0)]])),
    alice.post('/v2/message', lost),
    alice.post('/v2/message', { recipient: 'bob', body: 'plain again' })
  ])
  t.same(answers.map((a) => a.statusCode), [200, 200, 200, 404, 200])
  const metrics = await built.app.inject({ method: 'GET', url: '/metrics' })
  t.equal(Number(/^parley_send_batched_total (\d+)$/m.exec(metrics.body)?.[1]), 5, 'every send, files or not, went through the batch path')
  const stage = (name: string) => Number(new RegExp(`^parley_send_stage_seconds_count\\{stage="${name}"\\} (\\d+)$`, 'm').exec(metrics.body)?.[1])
  t.equal(stage('queued'), 5, 'each send\'s wait for its batch is timed')
  t.equal(stage('statement'), Number(/^parley_send_batches_total (\d+)$/m.exec(metrics.body)?.[1]), 'and each batch\'s statement')

  const read = async (id: string, n: number) => (await alice.get(`/v2/message/${id}/attachment/${n}`)).rawPayload
  const [first, , third] = answers.map((a) => a.json())
  t.same(first.attachments, [{ index: 1, filename: 'a.png', contentType: 'image/png', size: small.length }])
  t.ok((await read(first.id, 1)).equals(small), 'the small file, whole')
  t.same(third.attachments.map((a: { size: number }) => a.size), [large.length, 0])
  t.ok((await read(third.id, 1)).equals(large), 'the staged file, every chunk claimed')
  t.equal((await read(third.id, 2)).length, 0, 'the empty file')
  const [{ n }] = await queryRows<{ n: number }>(built.db, sql`SELECT count(*)::int AS n FROM attachment_chunks WHERE message_id IS NULL`) as [{ n: number }]
  t.equal(n, 0, "the refused send's file is not left behind")
})

t.test('over HTTP: a replay, a mismatch and a duplicate in flight share a batch with sends that go', async (t) => {
  const built = await build(t, { env: FAST })
  const alice = await built.as('alice')
  const erin = await built.as('erin', { dailyQuota: 0 })
  await built.createUser('bob')
  const first = await alice.post('/v2/message', { recipient: 'bob', body: 'once' }, { headers: { 'idempotency-key': 'k-1' } })
  t.equal(first.statusCode, 200)

  const answers = await Promise.all([
    alice.post('/v2/message', { recipient: 'bob', body: 'once' }, { headers: { 'idempotency-key': 'k-1' } }),
    alice.post('/v2/message', { recipient: 'bob', body: 'other' }, { headers: { 'idempotency-key': 'k-1' } }),
    alice.post('/v2/message', { recipient: 'bob', body: 'new' }, { headers: { 'idempotency-key': 'k-2' } }),
    alice.post('/v2/message', { recipient: 'bob', body: 'plain' }),
    alice.post('/v2/message', { recipient: 'nobody', body: 'lost' }),
    erin.post('/v2/message', { recipient: 'bob', body: 'no quota' })
  ])
  const [replayed, mismatch, fresh, plain, unknown, overQuota] = answers
  t.equal(replayed!.statusCode, 200)
  t.equal(replayed!.headers['idempotent-replayed'], 'true')
  t.equal(replayed!.json().id, first.json().id, 'the replay answers the original message')
  // Other fields under the same key: 422 once the replay's batch has committed, 409 while it is
  // still in flight beside it (two batches may be); either way it writes nothing (checked below).
  t.ok([409, 422].includes(mismatch!.statusCode), `other fields under a used key: ${mismatch!.statusCode}`)
  t.equal(fresh!.statusCode, 200)
  t.not(fresh!.headers['idempotent-replayed'], 'true')
  t.equal(plain!.statusCode, 200)
  t.equal(unknown!.statusCode, 404)
  t.match(unknown!.json().message, /nobody/)
  t.equal(overQuota!.statusCode, 429)

  const bodies = (await feed(built, 'bob')).map((e) => e.body).sort()
  t.same(bodies, ['new', 'once', 'plain'], 'written once each; the replay and the refusals wrote nothing')
  const counted = async () => (await queryRows<{ count: number }>(built.db, sql`SELECT count FROM quota_usage WHERE key_id = ${alice.keyId}`))[0]!.count
  const before = await counted()
  t.equal(before, 3, "alice's day counts her three written sends, not the replay or the refusals")
  const again = await alice.post('/v2/message', { recipient: 'bob', body: 'new' }, { headers: { 'idempotency-key': 'k-2' } })
  t.equal(again.json().id, fresh!.json().id, "a batched send's Idempotency-Key is recorded")
  t.equal(await counted(), before, 'and its replay counts nothing')

  const metrics = await built.app.inject({ method: 'GET', url: '/metrics' })
  const value = (name: string) => Number(new RegExp(`^${name} (\\d+)$`, 'm').exec(metrics.body)?.[1])
  t.ok(value('parley_send_batches_total') >= 1, 'operators see the batches written')
  t.ok(value('parley_send_batched_total') >= value('parley_send_batches_total'), 'and how many sends they carried')
})

/** Whether some statement of the test's database waits on a lock now (asked on `client`'s connection). */
async function waitsOnALock (client: pg.Client): Promise<boolean> {
  return (await client.query('SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = \'Lock\'')).rowCount! > 0
}

/** A second connection holding `address`'s user row in an open transaction (PostgreSQL only). */
async function holdUserRow (t: Test, built: Built, address: string): Promise<pg.Client> {
  const hold = new pg.Client({ connectionString: built.url })
  await hold.connect()
  t.teardown(() => hold.end())
  await hold.query('BEGIN')
  await hold.query('SELECT 1 FROM users WHERE address = $1 FOR UPDATE', [address])
  return hold
}

t.test('a batch waiting on a row lock does not hold other keys\' sends behind it', { skip: usingPostgres() ? false : 'holding a row needs a second connection: PostgreSQL only' }, async (t) => {
  const built = await build(t, { env: FAST })
  const alice = await built.as('alice')
  const erin = await built.as('erin')
  await built.createUser('bob')
  await built.createUser('carol')
  // Another transaction holds bob's user row (his feed's counter), as a long group change would.
  const hold = await holdUserRow(t, built, 'bob')

  const stuck = alice.post('/v2/message', { recipient: 'bob', body: 'waits for the lock' })
  await until(() => waitsOnALock(hold), { intervalMs: 10, message: 'the first send never waited on the held row' })
  const started = performance.now()
  const other = await erin.post('/v2/message', { recipient: 'carol', body: 'goes past' })
  const ms = performance.now() - started
  t.equal(other.statusCode, 200)
  t.ok(ms < 1_000, `the other key's send answered in ${ms.toFixed(0)} ms while the first batch waited`)

  await hold.query('ROLLBACK')
  t.equal((await stuck).statusCode, 200, 'and the waiting send goes once the row is free')
})

t.test('a client that hangs up while its send waits in the queue still gets a whole message', { skip: usingPostgres() ? false : 'holding a row needs a second connection: PostgreSQL only' }, async (t) => {
  const built = await build(t, { env: FAST })
  const alice = await built.as('alice')
  await built.createUser('bob')
  const hold = await holdUserRow(t, built, 'bob')

  // A staged attachment (larger than what a request may keep in memory), sent over a real
  // socket that the client closes once the body is out and its send waits on bob's row.
  const large = Buffer.from(Array.from({ length: 300 * 1024 }, (_, i) => (i * 7) % 253))
  const form = new FormData()
  form.append('recipient', 'bob')
  form.append('body', 'hung up')
  form.append('attachment', new Blob([new Uint8Array(large)], { type: 'image/png' }), 'big.png')
  const encoded = new Response(form)
  const payload = Buffer.from(await encoded.arrayBuffer())
  const address = await built.app.listen({ port: 0, host: '127.0.0.1' })
  const { port } = new URL(address)
  const req = http.request({
    host: '127.0.0.1',
    port: Number(port),
    method: 'POST',
    path: '/v2/message',
    headers: { authorization: alice.authorization, 'content-type': encoded.headers.get('content-type')!, 'content-length': payload.length }
  })
  req.on('error', () => {})
  req.end(payload)
  // The send's statement waits on bob's row: the body is read and the send is in its batch.
  await until(() => waitsOnALock(hold), { intervalMs: 10, message: 'the send never waited on the held row' })
  t.pass('the send waits on the held row')
  req.destroy()
  // The server has seen the hang-up before the row comes free.
  const connections = () => new Promise<number>((resolve, reject) => built.app.server.getConnections((err, n) => err ? reject(err) : resolve(n)))
  await until(async () => await connections() === 0, { message: 'the server never saw the client go' })
  await hold.query('ROLLBACK')

  let message: { id: string, attachments: { size: number }[] } | undefined
  await until(async () => {
    // The event's data is sealed (API.md §11): its message id is a column of its own.
    const rows = await queryRows<{ id: string }>(built.db, sql`
      SELECT message_id AS id FROM events WHERE address = 'bob' AND type = 'message.received'`)
    message = rows[0] === undefined ? undefined : { id: rows[0].id, attachments: [] }
    return message !== undefined
  }, { timeoutMs: 5_000, message: 'the send was never written' })
  t.ok(message !== undefined, 'the send was written after the client left')
  const bytes = (await alice.get(`/v2/message/${message!.id}/attachment/1`)).rawPayload
  t.ok(bytes.equals(large), 'and its attachment reads back whole: the hang-up discarded nothing it claimed')
})
