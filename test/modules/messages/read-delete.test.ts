import t from 'tap'
import { sql } from 'drizzle-orm'
import { queryRows } from '../../../src/db/rows.js'
import { build } from '../../helper.js'

t.test('GET /v2/message/:id: sender and recipient read it, a stranger gets 403, an unknown id 404', async (t) => {
  const { as } = await build(t)
  const alice = await as('alice')
  const bob = await as('bob')
  const carol = await as('carol')
  const sent = (await alice.post('/v2/message', { recipient: 'bob', body: 'secret plan' })).json()
  for (const caller of [alice, bob]) {
    const res = await caller.get(`/v2/message/${sent.id}`)
    t.equal(res.statusCode, 200, caller.address)
    t.same(res.json(), sent)
  }
  const stranger = await carol.get(`/v2/message/${sent.id}`)
  t.equal(stranger.statusCode, 403)
  t.match(stranger.json(), { code: 'FORBIDDEN', message: new RegExp(sent.id) })
  t.notMatch(stranger.body, /secret plan/)
  const unknown = await alice.get('/v2/message/msg_00000000000000000000000000')
  t.equal(unknown.statusCode, 404)
  t.same(unknown.json(), { statusCode: 404, error: 'Not Found', message: 'message msg_00000000000000000000000000 not found', code: 'NOT_FOUND' })
  const malformed = await alice.get('/v2/message/msg_../../etc')
  t.match(malformed.json(), { statusCode: 400, code: 'VALIDATION_FAILED', message: /params\/message/ })
  const long = await alice.get(`/v2/message/msg_${'a'.repeat(300)}`)
  t.equal(long.statusCode, 414)
  t.match(long.json(), { statusCode: 414, error: 'URI Too Long', code: 'VALIDATION_FAILED' })
  t.ok(long.headers['x-request-id'])
})

t.test('DELETE by a recipient hides the message for that recipient only', async (t) => {
  const { as } = await build(t)
  const alice = await as('alice')
  const bob = await as('bob')
  const sent = (await alice.post('/v2/message', { recipient: 'bob', body: 'hi' })).json()
  const res = await bob.delete(`/v2/message/${sent.id}`)
  t.equal(res.statusCode, 204)
  t.equal(res.body, '')
  t.equal((await bob.get(`/v2/message/${sent.id}`)).statusCode, 404, 'gone for bob')
  t.equal((await bob.delete(`/v2/message/${sent.id}`)).statusCode, 404)
  t.equal((await alice.get(`/v2/message/${sent.id}`)).statusCode, 200, 'still there for alice')
})

t.test('DELETE by the sender erases body and attachments from storage and tells each recipient', async (t) => {
  const { as, db } = await build(t)
  const alice = await as('alice')
  const bob = await as('bob')
  const carol = await as('carol')
  const form = new FormData()
  form.append('recipient', 'bob')
  form.append('body', 'burn after reading')
  form.append('attachment', new Blob([new Uint8Array(Buffer.from('TOP-SECRET-BYTES'))], { type: 'text/plain' }), 'plan.txt')
  const sent = (await alice.post('/v2/message', form, { headers: { 'idempotency-key': 'k1' } })).json()
  t.equal((await carol.delete(`/v2/message/${sent.id}`)).statusCode, 403, 'a stranger may not')
  t.equal((await alice.delete(`/v2/message/${sent.id}`)).statusCode, 204)
  for (const caller of [alice, bob]) {
    t.equal((await caller.get(`/v2/message/${sent.id}`)).statusCode, 404, `${caller.address}: later reads 404`)
    t.equal((await caller.get(`/v2/message/${sent.id}/attachment/1`)).statusCode, 404)
  }
  const [dump] = await queryRows<{ text: string }>(db, sql`
    SELECT concat_ws(' ',
      (SELECT string_agg(m::text, ' ') FROM messages m),
      (SELECT string_agg(a::text, ' ') FROM attachments a),
      (SELECT string_agg(encode(c.data, 'escape'), ' ') FROM attachment_chunks c),
      (SELECT string_agg(e.data::text, ' ') FROM events e),
      (SELECT string_agg(i::text, ' ') FROM idempotency_keys i)) AS text`)
  t.notMatch(dump!.text ?? '', /burn after reading|TOP-SECRET-BYTES/, 'no copy of body or bytes is left in any table')
  const [left] = await queryRows<{ n: number }>(db, sql`SELECT count(*)::int AS n FROM deliveries WHERE message_id = ${sent.id}`)
  t.equal(left!.n, 0, 'its delivery rows went with it')
  const feed = (await bob.get('/v2/events')).json()
  t.same(feed.events.map((e: { type: string }) => e.type), ['message.deleted'], 'the received event is gone, a deleted event arrived')
  t.same(feed.events[0].data, { message: sent.id })
})

t.test('a user or a message deleted by hand in SQL takes its feed and its delivery rows with it', async (t) => {
  // The send path writes events and deliveries without per-row key checks (migration 0013);
  // triggers do what the keys' cascades did, for an operator deleting rows by hand.
  const { as, db } = await build(t)
  const alice = await as('alice')
  const bob = await as('bob')
  const carol = await as('carol')
  const group = (await alice.post('/v2/group', { name: 'trio', members: ['bob', 'carol'] })).json()
  const toBob = (await alice.post('/v2/message', { recipient: 'bob', body: 'one' })).json()
  const fromBob = (await bob.post('/v2/message', { recipient: 'carol', body: 'two' })).json()
  const toGroup = (await alice.post('/v2/message', { recipient: group.id, body: 'three' })).json()
  const rows = async () => (await queryRows<{ t: string, k: string }>(db, sql`
    SELECT 'delivery' AS t, message_id || ' ' || recipient AS k FROM deliveries
    UNION ALL SELECT 'event', address || ' ' || coalesce(message_id, type) FROM events ORDER BY 1, 2`)).map((r) => `${r.t} ${r.k}`)
  const before = await rows()
  for (const row of [`delivery ${toBob.id} bob`, `event bob ${toBob.id}`, `delivery ${fromBob.id} carol`, `delivery ${toGroup.id} bob`]) {
    t.ok(before.includes(row), `written: ${row}`)
  }

  await queryRows(db, sql`DELETE FROM users WHERE address = 'bob'`)
  const after = await rows()
  t.notOk(after.some((r) => / bob$/.test(r) || r.startsWith('event bob ')), 'no delivery to bob and no event in his feed is left')
  t.notOk(after.some((r) => r.startsWith(`delivery ${fromBob.id}`)), "bob's message went (by its sender's key) and its deliveries with it")
  t.ok(after.includes(`delivery ${toGroup.id} carol`), "others' rows stay")
  t.equal((await carol.get(`/v2/message/${toGroup.id}`)).statusCode, 200)

  await queryRows(db, sql`DELETE FROM messages WHERE id = ${toGroup.id}`)
  t.notOk((await rows()).some((r) => r.startsWith(`delivery ${toGroup.id}`)), 'a message deleted by hand takes its deliveries with it')
  t.equal((await alice.post('/v2/message', { recipient: 'carol', body: 'four' })).statusCode, 200, 'sending goes on')
  t.equal((await alice.post('/v2/message', { recipient: 'bob', body: 'five' })).statusCode, 404, 'to a user no longer there: 404, nothing written')
  t.notOk((await rows()).some((r) => / bob$/.test(r) || r.startsWith('event bob ')), 'still nothing for bob')

  // What the keys held fixed stays fixed; TRUNCATE orphans nothing.
  const refusal = (query: ReturnType<typeof sql>) => queryRows(db, query).then(() => 'accepted',
    (err: Error & { cause?: Error }) => err.cause?.message ?? err.message)
  t.match(await refusal(sql`UPDATE users SET address = 'caroline' WHERE address = 'carol'`), /address of a row of users cannot change/)
  t.match(await refusal(sql`UPDATE messages SET id = 'msg_renamed' WHERE sender = 'alice'`), /id of a row of messages cannot change/)
  t.ok((await rows()).length > 0, 'carol still has her rows')
  await queryRows(db, sql`TRUNCATE users CASCADE`)
  t.same(await rows(), [], 'emptying users empties the feeds and deliveries')
})

t.test('a hand delete in a session with temporary tables named like the real ones still cleans the real rows', async (t) => {
  // The triggers run as their owner: they must resolve their own schema's tables, never a
  // session's temporary ones (pg_temp is searched first unless search_path puts it last).
  const { as, db } = await build(t)
  const alice = await as('alice')
  const bob = await as('bob')
  const carol = await as('carol')
  const toBob = (await alice.post('/v2/message', { recipient: 'bob', body: 'one' })).json()
  const toCarol = (await alice.post('/v2/message', { recipient: 'carol', body: 'two' })).json()
  const fromCarol = (await carol.post('/v2/message', { recipient: 'alice', body: 'three' })).json()
  t.equal((await bob.get('/v2/events')).json().events.length, 1)
  await db.transaction(async (tx) => {
    for (const name of ['deliveries', 'events', 'users', 'messages']) {
      await queryRows(tx, sql.raw(`CREATE TEMPORARY TABLE "${name}" (LIKE public."${name}" INCLUDING DEFAULTS) ON COMMIT DROP`))
    }
    await queryRows(tx, sql.raw('CREATE TEMPORARY TABLE "gone" (address text, id text) ON COMMIT DROP'))
    await queryRows(tx, sql`INSERT INTO pg_temp.deliveries (message_id, recipient) VALUES (${toCarol.id}, 'carol')`)
    await queryRows(tx, sql`DELETE FROM public.users WHERE address = 'bob'`)
    await queryRows(tx, sql`DELETE FROM public.messages WHERE id = ${toCarol.id}`)
    const [temp] = await queryRows<{ n: number }>(tx, sql`SELECT count(*)::int AS n FROM pg_temp.deliveries`)
    t.equal(temp!.n, 1, 'the session\'s own temporary table is left alone')
  })
  const [left] = await queryRows<{ deliveries: string | null, events: string | null }>(db, sql`
    SELECT (SELECT string_agg(message_id || ' ' || recipient, ',' ORDER BY message_id) FROM deliveries) AS deliveries,
      (SELECT string_agg(address, ',' ORDER BY address) FROM events) AS events`)
  t.equal(left!.deliveries, `${fromCarol.id} alice`, `no delivery of ${toBob.id} to bob nor of the deleted ${toCarol.id} is left`)
  t.equal(left!.events, 'alice,carol', 'bob\'s feed went with him')
})
