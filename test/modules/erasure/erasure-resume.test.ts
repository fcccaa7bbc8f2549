import { sql } from 'drizzle-orm'
import t from 'tap'
import { connectPostgres } from '../../../src/db/client.js'
import { queryRows } from '../../../src/db/rows.js'
import { eraseRequested } from '../../../src/modules/erasure/erasure.js'
import { ok, rowsWhere, sendMany, setUp } from './support.js'

/** Batches of two messages (or two rows of anything else): a handful of messages takes several transactions. */
const SMALL = { messages: 2, rows: 2, events: 100 }

t.test('an erasure goes in batches and resumes after a restart: one batch done, a new instance on the same database finishes it', async (t) => {
  // This instance records erasures but runs no job: the test drives the first batch itself.
  const { admin, as, db, erasureOf, erased, secondInstance } = await setUp(t, { erasure: { background: false } })
  const eve = await as('eve')
  const alice = await as('alice')
  await as('bob')
  const sent = await sendMany(eve, 'alice', 7)
  const group = ok(await eve.post('/v2/group', { name: 'g', members: ['alice', 'bob'] })).id as string
  await sendMany(eve, group, 2)
  const kept = await sendMany(alice, 'eve', 3, 'from alice')

  ok(await admin.delete('/v2/admin/users/eve'), 202)
  t.equal(await rowsWhere(db, 'messages', 'sender', 'eve'), 9, 'nothing erased by the request itself')

  const one = await eraseRequested(db, { graceMs: 0, batch: SMALL, maxBatches: 1 })
  t.match(one, { ran: true, batches: 1, erased: [] })
  t.equal(await rowsWhere(db, 'messages', 'sender', 'eve'), 7, 'one batch: the two oldest messages')
  t.equal((await alice.get(`/v2/message/${sent[0]}`)).statusCode, 404)
  t.equal((await alice.get(`/v2/message/${sent[2]}`)).statusCode, 200, 'the rest wait for the next batch')
  t.equal(await erasureOf('eve'), 'pending')

  // The process ends here (a kill between batches leaves exactly this: each batch commits alone);
  // an instance started on the same database goes on from the database's state.
  const restarted = await secondInstance({}, { graceMs: 0, batch: SMALL })
  await erased('eve', restarted)
  t.equal(await rowsWhere(db, 'messages', 'sender', 'eve'), 0)
  t.equal(await rowsWhere(db, 'group_members', 'address', 'eve'), 0)
  t.match(ok(await alice.get(`/v2/group/${group}`)), { owner: 'alice' }, 'the group passed on')
  for (const id of kept) t.match(ok(await alice.get(`/v2/message/${id}`)), { sender: 'alice', recipient: 'eve' }, 'alice\'s messages to eve stay')
  t.equal(await rowsWhere(db, 'deliveries', 'recipient', 'eve'), 0, 'eve\'s delivery rows went')
})

t.test('an erasure stays pending through its grace, and what lands meanwhile (a send admitted before the deactivation) is erased too', async (t) => {
  const { admin, as, db, erasureOf } = await setUp(t, { erasure: { background: false } })
  const eve = await as('eve')
  await as('alice')
  await sendMany(eve, 'alice', 3)
  ok(await admin.delete('/v2/admin/users/eve'), 202)

  const early = await eraseRequested(db, { graceMs: 60_000 })
  t.match(early, { ran: true, erased: [] })
  t.ok(early.batches >= 1, 'its content goes at once')
  t.ok(early.dueInMs !== undefined && early.dueInMs > 50_000 && early.dueInMs <= 60_000, `due in ${early.dueInMs} ms`)
  t.equal(await rowsWhere(db, 'messages', 'sender', 'eve'), 0)
  t.equal(await erasureOf('eve'), 'pending', 'but it is not done before the grace has passed')

  // As if a request eve's key made on another instance before the deactivation reached it committed now.
  await db.execute(sql`INSERT INTO messages (id, sender, recipient, body) VALUES ('msg_0late', 'eve', 'alice', 'late')`)
  await db.execute(sql`INSERT INTO deliveries (message_id, recipient) VALUES ('msg_0late', 'alice')`)
  const later = await eraseRequested(db, { graceMs: 0 })
  t.match(later, { ran: true, erased: ['eve'] })
  t.equal(later.dueInMs, undefined, 'nothing left waiting')
  t.equal(await rowsWhere(db, 'messages', 'sender', 'eve'), 0, 'the late message is erased too')
  t.equal(await erasureOf('eve'), 'done')
  t.match(await eraseRequested(db, { graceMs: 0 }), { ran: true, batches: 0, erased: [] }, 'then there is nothing to do')
})

t.test('two instances erasing at once erase each message once, without error', async (t) => {
  const { admin, as, db, url, logs } = await setUp(t, { erasure: { background: false } })
  const eve = await as('eve')
  await as('alice')
  const sent = await sendMany(eve, 'alice', 15)
  ok(await admin.delete('/v2/admin/users/eve'), 202)
  // Another process's pool on PostgreSQL; PGlite is one connection per process, shared.
  const other = url === undefined ? undefined : await connectPostgres(url, 5)
  t.teardown(async () => { await other?.close() })
  const otherDb = other?.db ?? db

  let batches = 0
  const erased: string[] = []
  for (let round = 0; round < 50 && erased.length === 0; round++) {
    const both = await Promise.all([db, otherDb].map(async (on) => eraseRequested(on, { graceMs: 0, batch: SMALL, maxBatches: 2 })))
    for (const result of both) {
      batches += result.batches
      erased.push(...result.erased)
    }
  }
  t.same(erased, ['eve'], 'marked done once')
  t.equal(await rowsWhere(db, 'messages', 'sender', 'eve'), 0)
  const told = await queryRows<{ message: string }>(db, sql`
    SELECT data->>'message' AS message FROM events WHERE address = 'alice' AND type = 'message.deleted' ORDER BY 1`)
  t.same(told.map((r) => r.message), [...sent].sort(), 'alice was told of each deletion exactly once')
  t.ok(batches >= 8, `${batches} batches`)
  t.notMatch(logs(), /erasure failed|"level":50/, 'no error logged')
})
