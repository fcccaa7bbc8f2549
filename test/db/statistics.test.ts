import { PGlite } from '@electric-sql/pglite'
import { sql } from 'drizzle-orm'
import pg from 'pg'
import t from 'tap'
import type { Db } from '../../src/db/client.js'
import { queryRows } from '../../src/db/rows.js'
import { analyzeStaleTables } from '../../src/db/statistics.js'
import { freshDatabase } from '../support/databases.js'
import { childDatabaseEnv, startServer } from '../support/processes.js'
import { TEST_SEALING_KEYS } from '../support/sealing.js'
import { until } from '../support/until.js'

const USERS = 3_000
const fill = `INSERT INTO users (address) SELECT 'stat-u' || i FROM generate_series(1, ${USERS}) AS i`

async function plannedUsers (db: Db): Promise<number> {
  const [row] = await queryRows<{ tuples: number }>(db, sql`SELECT reltuples::int AS tuples FROM pg_class WHERE oid = 'users'::regclass`)
  return row!.tuples
}

/** How the planner reads users for a send's feed rows (events.repository.ts takeFeedIds' `locked`): its scans, by kind. */
async function feedLockScans (db: Db): Promise<string> {
  const rows = await queryRows<{ 'QUERY PLAN': string }>(db, sql`EXPLAIN SELECT address FROM users
    WHERE address IN (SELECT unnest(ARRAY['stat-u1', 'stat-u2', 'stat-u3'])) AND deactivated_at IS NULL ORDER BY address FOR NO KEY UPDATE`)
  return rows.map((r) => r['QUERY PLAN']).filter((line) => /Scan.* on users\b/.test(line)).join('\n')
}

t.test('tables with rows and no statistics, or grown past them, are analyzed; then nothing is left to do', async (t) => {
  const fresh = await freshDatabase()
  t.teardown(() => fresh.drop())
  const db = fresh.database.db
  // Autovacuum (PostgreSQL) must not analyze users behind the test's back.
  await db.execute(sql`ALTER TABLE users SET (autovacuum_enabled = off)`)
  await analyzeStaleTables(db)
  t.same(await analyzeStaleTables(db), [], 'a database just analyzed has nothing stale')

  // As after a bulk load, a restore or a clone: the rows are there, the planner was not told.
  await db.execute(sql.raw(fill))
  t.ok(await plannedUsers(db) < USERS / 10, `the planner takes users for ${await plannedUsers(db)} rows before`)
  // PostgreSQL's choice, not ours: for the record, not asserted.
  t.comment(`before: ${await feedLockScans(db)}`)

  const analyzed = await analyzeStaleTables(db)
  t.ok(analyzed.includes('users'), `users analyzed (${analyzed.join(', ')})`)
  t.ok(await plannedUsers(db) >= USERS, `the planner takes users for ${await plannedUsers(db)} rows after`)
  t.match(await feedLockScans(db), /Index (Only )?Scan using users_pkey on users/, 'and reads the feed rows by its key')
  t.notMatch(await feedLockScans(db), /Seq Scan/, 'and no longer scans the table')
  t.same(await analyzeStaleTables(db), [], 'analyzed once: nothing left')

  // A table that grew well past what the planner was told (20 %, and 8 pages) is analyzed again.
  await db.execute(sql.raw(fill.replace("'stat-u'", "'stat-v'")))
  t.ok((await analyzeStaleTables(db)).includes('users'), 'users analyzed again once it doubled')

  // A table whose rows are all gone keeps its pages (the embedded database never vacuums) and
  // gets no statistics from an ANALYZE: counted empty once, then left alone.
  await db.execute(sql`CREATE TABLE stat_emptied (n int)`)
  await db.execute(sql`INSERT INTO stat_emptied SELECT generate_series(1, 5000)`)
  await db.execute(sql`DELETE FROM stat_emptied`)
  t.ok((await analyzeStaleTables(db)).includes('stat_emptied'), 'a table of dead rows is analyzed once')
  t.same(await analyzeStaleTables(db), [], 'and not again')
  await db.execute(sql`DROP TABLE stat_emptied`)
})

t.test('the server analyzes, once it listens, a database whose tables have rows and no statistics', async (t) => {
  const env = await childDatabaseEnv(t)
  // Filled before the server starts, as a restored or cloned database would be.
  if (env.DATABASE_URL !== undefined) {
    const client = new pg.Client({ connectionString: env.DATABASE_URL })
    await client.connect()
    try {
      await client.query(fill)
    } finally {
      await client.end()
    }
  } else {
    const client = await PGlite.create(env.DATA_DIR!)
    await client.exec(fill)
    await client.close()
  }
  const server = await startServer(t, { ...env, SEALING_KEYS: TEST_SEALING_KEYS })
  await until(() => /analyzed tables whose planner statistics were missing/.test(server.output()), { message: 'the start\'s analysis logged', timeoutMs: 30_000 })
  const line = server.output().split('\n').find((l) => l.includes('analyzed tables whose planner statistics'))!
  const logged = JSON.parse(line) as { tables: string[], ms: number }
  t.ok(logged.tables.includes('users'), `users among the tables analyzed (${logged.tables.join(', ')}, ${logged.ms} ms)`)
  t.equal(await server.stop(), 0, 'the server stops cleanly after')
})
