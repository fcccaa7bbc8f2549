import { setTimeout as sleep } from 'node:timers/promises'
import { sql } from 'drizzle-orm'
import t from 'tap'
import { connectPostgres } from '../../../src/db/client.js'
import { MESSAGE_PURGE_BATCH, purgeExpired } from '../../../src/modules/retention/retention.js'
import { usingPostgres } from '../../support/databases.js'
import { build } from '../../helper.js'
import { countRows, holdOffAppSweeps, insertOldMessages, rowsAbout } from './support.js'

const RETENTION = { messageRetentionDays: 30 }
/** retention.ts's RETENTION_LOCK_KEY ("ret"), as another instance's sweep takes it. */
const RETENTION_LOCK = 0x70726574

t.test('a backlog larger than a batch is purged a batch per transaction; a sweep stopped after some batches is resumed by the next', async (t) => {
  const { as, db } = await build(t, { env: { MESSAGE_RETENTION_DAYS: '30' } })
  await holdOffAppSweeps(db)
  const alice = await as('alice')
  const bob = await as('bob')
  const backlog = MESSAGE_PURGE_BATCH * 2 + 234
  const old = await insertOldMessages(db, { label: 1, sender: 'alice', recipient: 'bob', readers: ['bob'], count: backlog, days: 40 })
  const recent = await insertOldMessages(db, { label: 2, sender: 'alice', recipient: 'bob', readers: ['bob'], count: 10, days: 20 })
  const fresh = (await alice.post('/v2/message', { recipient: 'bob', body: 'fresh' })).json().id as string
  t.equal(await rowsAbout(db, 'deliveries', 'message_id', old), backlog)
  t.equal(await rowsAbout(db, 'events', 'message_id', old), backlog)

  // A sweep interrupted after one batch (as a kill between batches, or shutdown, leaves it).
  t.match(await purgeExpired(db, 0, 365, { ...RETENTION, maxMessageBatches: 1 }), { ran: true, messages: MESSAGE_PURGE_BATCH })
  t.equal(await rowsAbout(db, 'messages', 'id', old), backlog - MESSAGE_PURGE_BATCH, 'one batch went')
  t.equal(await rowsAbout(db, 'messages', 'id', old.slice(-MESSAGE_PURGE_BATCH)), 0, 'the oldest first')
  t.equal(await rowsAbout(db, 'deliveries', 'message_id', old), backlog - MESSAGE_PURGE_BATCH, 'with their deliveries')
  t.equal(await rowsAbout(db, 'events', 'message_id', old), backlog - MESSAGE_PURGE_BATCH, 'and their events')

  // An aborted sweep (shutdown) stops before its next batch.
  const stopped = new AbortController()
  stopped.abort()
  t.match(await purgeExpired(db, 0, 365, { ...RETENTION, signal: stopped.signal }), { ran: true, messages: 0 })

  const rest = await purgeExpired(db, 0, 365, RETENTION)
  t.match(rest, { ran: true, messages: backlog - MESSAGE_PURGE_BATCH }, 'the next sweep takes the rest, batch after batch')
  t.equal(await rowsAbout(db, 'messages', 'id', old), 0)
  for (const table of ['deliveries', 'events', 'message_reactions']) t.equal(await rowsAbout(db, table, 'message_id', old), 0, `no ${table} row left of them`)
  t.equal(await rowsAbout(db, 'messages', 'id', [...recent, fresh]), recent.length + 1, 'younger messages stay')
  t.equal(await rowsAbout(db, 'deliveries', 'message_id', [...recent, fresh]), recent.length + 1)
  t.equal((await bob.get('/v2/conversations/alice/messages?limit=200')).json().messages.length, recent.length + 1)
  t.match(await purgeExpired(db, 0, 365, RETENTION), { messages: 0 }, 'then nothing')
})

t.test('two instances sweeping at once purge every message exactly once, without error', async (t) => {
  const { as, db, url, logs } = await build(t, { env: { MESSAGE_RETENTION_DAYS: '30' } })
  await holdOffAppSweeps(db)
  await as('alice')
  await as('bob')
  await as('carol')
  // Another process's pool on PostgreSQL (its own connections, its own lock attempts); PGlite
  // is one connection per process, shared as a second instance there shares it.
  const other = url === undefined ? undefined : await connectPostgres(url, 5)
  t.teardown(async () => { await other?.close() })
  const otherDb = other?.db ?? db
  const backlog = MESSAGE_PURGE_BATCH * 4 + 17
  const old = await insertOldMessages(db, { label: 3, sender: 'alice', recipient: 'bob', readers: ['bob'], count: backlog, days: 45 })
  const before = await countRows(db, 'messages')

  let purged = 0
  let sweeps = 0
  for (let round = 0; round < 20 && await rowsAbout(db, 'messages', 'id', old) > 0; round++) {
    // Each instance stops after two batches, so the two keep overlapping until the backlog is done.
    const both = await Promise.all([db, otherDb].map(async (on) => purgeExpired(on, 0, 365, { ...RETENTION, maxMessageBatches: 2 })))
    for (const result of both) {
      purged += result.messages
      if (result.ran) sweeps++
    }
  }
  t.equal(await rowsAbout(db, 'messages', 'id', old), 0, 'the whole backlog is gone')
  t.equal(purged, backlog, 'and the counts add up to it: no message taken twice, none lost')
  t.equal(await countRows(db, 'messages'), before - backlog, 'nothing else went')
  t.ok(sweeps >= 3, `${sweeps} sweeps ran`)
  t.notMatch(logs(), /retention sweep failed|"level":50/, 'no error logged')
})

t.test('a purge under way is not ended by another instance taking the lock for a moment (its claim check)', { skip: usingPostgres() ? false : 'PostgreSQL only: the embedded database has one connection, so nothing else can hold a lock meanwhile' }, async (t) => {
  const { as, db, url } = await build(t, { env: { MESSAGE_RETENTION_DAYS: '30' } })
  await holdOffAppSweeps(db)
  await as('alice')
  await as('bob')
  const backlog = MESSAGE_PURGE_BATCH * 8
  const old = await insertOldMessages(db, { label: 6, sender: 'alice', recipient: 'bob', readers: ['bob'], count: backlog, days: 45 })
  // Another instance's sweeps, again and again: each takes the retention lock for 50 ms (a
  // claim check's transaction), as every instance's timer does once a period.
  const other = await connectPostgres(url!, 2)
  t.teardown(async () => { await other.close() })
  let checking = true
  let held = 0
  const checks = (async () => {
    // From the purge's first batch on: the sweep must first claim its period (its own try at the
    // lock, which a claim check held nearly all the time would fail, as it should).
    while (checking && await rowsAbout(other.db, 'messages', 'id', old) === backlog) await sleep(2)
    while (checking) {
      await other.db.execute(sql`SELECT pg_sleep(0.05) FROM (SELECT pg_try_advisory_xact_lock(${RETENTION_LOCK})) locked`)
      held++
      await sleep(2)
    }
  })()
  const swept = await purgeExpired(db, 0, 365, { ...RETENTION, rest: true })
  checking = false
  await checks
  t.comment(`${held} claim checks during the purge`)
  t.equal(swept.messages, backlog, 'the whole backlog in this one sweep')
  t.equal(await rowsAbout(db, 'messages', 'id', old), 0)
})

t.test('a batch that skips messages other work holds does not end the sweep', { skip: usingPostgres() ? false : 'PostgreSQL only: the embedded database has one connection, so nothing else can hold a row meanwhile' }, async (t) => {
  const { as, db, url } = await build(t, { env: { MESSAGE_RETENTION_DAYS: '30' } })
  await holdOffAppSweeps(db)
  await as('alice')
  await as('bob')
  const backlog = MESSAGE_PURGE_BATCH * 3
  const old = await insertOldMessages(db, { label: 7, sender: 'alice', recipient: 'bob', readers: ['bob'], count: backlog, days: 45 })
  // The oldest 100, which every batch comes to first, held by another connection as a
  // reaction's fan-out holds its message (key share) or a sealing pass its page's rows.
  const held = old.slice(-100)
  const other = await connectPostgres(url!, 1)
  t.teardown(async () => { await other.close() })
  let release = () => {}
  const released = new Promise<void>((resolve) => { release = resolve })
  let holding = () => {}
  const holds = new Promise<void>((resolve) => { holding = resolve })
  const holder = other.db.transaction(async (tx) => {
    await tx.execute(sql`SELECT id FROM messages WHERE id = ANY(${sql.param(held)}::text[]) FOR KEY SHARE`)
    holding()
    await released
  })
  await holds
  const swept = await purgeExpired(db, 0, 365, RETENTION).finally(release)
  await holder
  t.equal(swept.messages, backlog - held.length, 'every message not held, in one sweep')
  t.equal(await rowsAbout(db, 'messages', 'id', held), held.length, 'the held ones stay')
  t.match(await purgeExpired(db, 0, 365, RETENTION), { messages: held.length }, 'for the next sweep, once let go')
  t.equal(await rowsAbout(db, 'messages', 'id', old), 0)
})
