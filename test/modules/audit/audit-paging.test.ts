import { sql } from 'drizzle-orm'
import t from 'tap'
import { queryRows } from '../../../src/db/rows.js'
import { AUDIT_PURGE_BATCH, purgeExpired } from '../../../src/modules/retention/retention.js'
import { runCliInProcess } from '../../support/processes.js'
import { actorOf, setUp, type Entry } from './support.js'

t.test('GET /v2/admin/audit pages newest first with an opaque cursor, by actor, action and target', async (t) => {
  const { admin, audit, database, callerFor, createKey, createUser } = await setUp(t)
  await createUser('ops')
  const ops = callerFor('ops', await createKey('ops'))
  // Made without the API, so that ops may administer but its key is not in the log itself.
  await admin.post(`/v2/admin/keys/${ops.keyId}`, { scopes: ['read', 'send', 'admin'] })
  const keys: string[] = []
  for (let i = 0; i < 12; i++) {
    const by = i % 3 === 0 ? ops : admin
    t.equal((await by.post('/v2/admin/users', { address: `user${i}` })).statusCode, 200)
    if (i % 4 === 0) t.equal((await runCliInProcess(['user', 'deactivate', `user${i}`], {}, database)).code, 0)
    const key = await admin.post('/v2/admin/keys', { address: `user${i}` })
    t.equal(key.statusCode, 200)
    keys.push(key.json().keyId)
  }
  const all = await audit()
  t.equal(all.length, 1 + 12 + 3 + 12)
  const ids = all.map((e) => Number(e.id))
  t.same(ids, [...ids].sort((a, b) => b - a), 'newest first')
  t.equal(new Set(ids).size, ids.length)

  // Small pages see every entry once, in the same order as one big page.
  t.same(await audit('', 5), all, 'pages of 5 add up to the whole log')
  const first = await admin.get('/v2/admin/audit?limit=5')
  t.equal(first.json().entries.length, 5)
  t.type(first.json().nextCursor, 'string')
  t.notMatch(first.json().nextCursor, /^[0-9]+$/, 'the cursor is opaque')
  t.same((await admin.get('/v2/admin/audit')).json(), { entries: all, nextCursor: null }, 'without limit: up to 50, all of them here')

  const byAction = await audit('action=user.create', 4)
  t.same(byAction.map((e) => e.target), Array.from({ length: 12 }, (_, i) => `user${11 - i}`))
  const byOps = await audit('action=user.create&actor=OPS', 2)
  t.same(byOps, all.filter((e) => e.action === 'user.create' && e.actor !== 'cli' && e.actor.address === 'ops'), 'by address and action')
  t.equal(byOps.length, 4)
  t.same(await audit(`actor=${ops.keyId}`, 3), all.filter((e) => e.actor !== 'cli' && e.actor.key === ops.keyId), 'by key id')
  const byCli = await audit('actor=cli', 2)
  t.same(byCli.map((e) => [e.action, e.target]), [['user.deactivate', 'user8'], ['user.deactivate', 'user4'], ['user.deactivate', 'user0']])
  t.same((await audit('target=USER4')).map((e) => e.action), ['user.deactivate', 'user.create'], 'by target, case-insensitive')
  t.same((await audit(`target=${keys[4]!}`)).map((e) => [e.action, e.actor]), [['key.create', actorOf(admin)]], 'by key id as target')
  t.same(await audit('actor=nobody'), [], 'no match: an empty page')
  t.same((await admin.get('/v2/admin/audit?actor=nobody')).json(), { entries: [], nextCursor: null })
})

t.test('retention purges entries older than AUDIT_RETENTION_DAYS in bounded batches, once per claimed sweep', async (t) => {
  const { admin, audit, db } = await setUp(t)
  t.equal((await admin.post('/v2/admin/users', { address: 'recent' })).statusCode, 200)
  // Old entries, as a year and more of use would leave them (the clock is the database's).
  const old = AUDIT_PURGE_BATCH * 2 + 7
  await db.execute(sql`INSERT INTO audit_log (at, action, target) SELECT now() - interval '400 days' - g * interval '1 second', 'user.create', 'old' || g FROM generate_series(1, ${old}) g`)
  await db.execute(sql`INSERT INTO audit_log (at, action, target) VALUES (now() - interval '40 days', 'user.create', 'forty'), (now() - interval '20 days', 'user.create', 'twenty')`)
  const count = async () => Number((await queryRows<{ n: string | number }>(db, sql`SELECT count(*) AS n FROM audit_log`))[0]!.n)
  t.equal(await count(), old + 3)

  const swept = await purgeExpired(db)
  t.match(swept, { ran: true, auditEntries: old }, 'every entry past 365 days (the default), a batch at a time')
  t.same((await audit()).map((e: Entry) => e.target), ['twenty', 'forty', 'recent'])

  t.match(await purgeExpired(db, 60_000, 30), { ran: false, auditEntries: 0 }, 'another sweep within the period is skipped: one instance does the work')
  t.equal(await count(), 3)
  t.match(await purgeExpired(db, 0, 30), { ran: true, auditEntries: 1 }, 'AUDIT_RETENTION_DAYS=30')
  t.same((await audit()).map((e: Entry) => e.target), ['twenty', 'recent'])
})
