import { createHash, randomBytes } from 'node:crypto'
import { appendFileSync, mkdirSync, readdirSync, readFileSync, renameSync, writeFileSync, existsSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { PGlite } from '@electric-sql/pglite'
import pg from 'pg'
import tap from 'tap'
import { connectPostgres, wrapPglite, type Database } from '../../src/db/client.js'
import { MIGRATIONS_FOLDER, migrateDatabase } from '../../src/db/migrate.js'

/** Changes whenever a migration does, so a stale snapshot or template is never reused. */
function migrationsHash (): string {
  const hash = createHash('sha256')
  const files = readdirSync(MIGRATIONS_FOLDER, { recursive: true, encoding: 'utf8' }).sort()
  for (const file of files) {
    const path = join(MIGRATIONS_FOLDER, file)
    if (file.endsWith('.sql') || file.endsWith('.json')) hash.update(file).update(readFileSync(path))
  }
  const pgliteVersion = (JSON.parse(readFileSync('node_modules/@electric-sql/pglite/package.json', 'utf8')) as { version: string }).version
  return hash.update(pgliteVersion).digest('hex').slice(0, 12)
}

let snapshot: Promise<Blob> | undefined

/**
 * PGlite's start with 16 MB of shared buffers instead of 128: a test's data fits many times
 * over, and zeroing the default pool was ~0.5 s of CPU of an instance's start (1.4 s on a
 * loaded machine), paid at least once by every test process.
 */
const START_PARAMS = [...PGlite.defaultStartParams, '-c', 'shared_buffers=16MB']

/**
 * A migrated PGlite data directory as a tarball: initdb costs seconds and ~0.9 GB, loading a
 * snapshot a fraction of that. Cached on disk for the other test processes of the run,
 * written atomically so parallel files never read half a snapshot.
 */
async function pgliteSnapshot (): Promise<Blob> {
  snapshot ??= (async () => {
    const dir = join(tmpdir(), 'parley-test')
    const file = join(dir, `pglite-${migrationsHash()}.tar.gz`)
    if (existsSync(file)) return new Blob([readFileSync(file)])
    const client = await PGlite.create({ startParams: START_PARAMS })
    const database = wrapPglite(client)
    await migrateDatabase(database)
    const dump = await client.dumpDataDir('gzip')
    await database.close()
    mkdirSync(dir, { recursive: true })
    const partial = `${file}.${process.pid}.tmp`
    writeFileSync(partial, Buffer.from(await dump.arrayBuffer()))
    renameSync(partial, file)
    return dump
  })()
  return snapshot
}

export interface TestDatabase {
  database: Database
  /** For child processes: the PostgreSQL URL of this database (undefined on PGlite). */
  url: string | undefined
  drop(): Promise<void>
}

export const usingPostgres = (): boolean => process.env.DATABASE_URL !== undefined && process.env.DATABASE_URL !== ''

function withDatabaseName (url: string, name: string): string {
  const u = new URL(url)
  u.pathname = `/${name}`
  return u.toString()
}

async function admin<T> (fn: (client: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: process.env.DATABASE_URL })
  await client.connect()
  try {
    return await fn(client)
  } finally {
    await client.end()
  }
}

let template: Promise<string> | undefined

/** A migrated template database, made once per run (under an advisory lock across processes). */
async function postgresTemplate (): Promise<string> {
  template ??= admin(async (client) => {
    const base = new URL(process.env.DATABASE_URL!).pathname.slice(1) || 'postgres'
    const name = `${base.slice(0, 30)}_tpl_${migrationsHash()}`
    await client.query('SELECT pg_advisory_lock(hashtext($1))', [name])
    try {
      const exists = await client.query('SELECT 1 FROM pg_database WHERE datname = $1', [name])
      if (exists.rowCount === 0) {
        await client.query(`CREATE DATABASE "${name}"`)
        const database = await connectPostgres(withDatabaseName(process.env.DATABASE_URL!, name), 1)
        try {
          await migrateDatabase(database)
        } finally {
          await database.close()
        }
      }
    } finally {
      await client.query('SELECT pg_advisory_unlock(hashtext($1))', [name])
    }
    return name
  })
  return template
}

/** What a migrated embedded database holds: every table, the rows migrations put in them, and its schema's fingerprint. */
interface Migrated {
  tables: string[]
  seeds: { table: string, rows: string }[]
  fingerprint: string
}

/**
 * The schema's shape: relations, columns, functions, triggers and indexes. A test that changed
 * it (or a broken instance, which cannot answer) makes an instance unfit to hand on.
 */
const FINGERPRINT = `SELECT md5(string_agg(item, ',' ORDER BY item)) AS fingerprint FROM (
  SELECT c.relname || ':' || c.relkind::text AS item FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public'
  UNION ALL SELECT c.relname || '.' || a.attname || ':' || format_type(a.atttypid, a.atttypmod) FROM pg_attribute a
    JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public' AND a.attnum > 0 AND NOT a.attisdropped
  UNION ALL SELECT p.proname || ':' || md5(p.prosrc) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'public'
  UNION ALL SELECT t.tgname || ':' || t.tgenabled::text FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public'
) AS shape`

let migrated: Promise<Migrated> | undefined

/** Read once, from the first instance, before any test has used it. */
function describeMigrated (client: PGlite): Promise<Migrated> {
  migrated ??= (async () => {
    const listed = await client.query<{ name: string }>('SELECT quote_ident(tablename) AS name FROM pg_tables WHERE schemaname = \'public\' ORDER BY tablename')
    const tables = listed.rows.map((row) => row.name)
    const seeds: Migrated['seeds'] = []
    for (const table of tables) {
      const rows = await client.query<{ rows: string | null }>(`SELECT json_agg(t)::text AS rows FROM ${table} AS t`)
      if (rows.rows[0]?.rows != null) seeds.push({ table, rows: rows.rows[0].rows })
    }
    const shape = await client.query<{ fingerprint: string }>(FINGERPRINT)
    return { tables, seeds, fingerprint: shape.rows[0]!.fingerprint }
  })()
  return migrated
}

/**
 * Puts a used instance back as the migrations left it, or says it cannot be: its tables
 * emptied and the migrations' rows written again, its session as new (no transaction, no
 * setting, no advisory lock, no LISTEN, no temporary table), its schema unchanged.
 */
async function reset (client: PGlite, state: Migrated): Promise<boolean> {
  try {
    if (client.isInTransaction()) await client.exec('ROLLBACK')
    // With no trigger firing (session_replication_role): the migrations' rows are written
    // back as they were, side effects and all, and users' TRUNCATE trigger does not reach
    // into tables this same statement empties.
    await client.exec(`RESET ALL; SELECT pg_advisory_unlock_all(); UNLISTEN *; DISCARD TEMP;
      SET session_replication_role = replica; TRUNCATE ${state.tables.join(', ')} RESTART IDENTITY CASCADE`)
    for (const seed of state.seeds) {
      await client.query(`INSERT INTO ${seed.table} SELECT * FROM json_populate_recordset(NULL::${seed.table}, $1::json)`, [seed.rows])
    }
    await client.exec('RESET session_replication_role')
    const shape = await client.query<{ fingerprint: string }>(FINGERPRINT)
    return shape.rows[0]?.fingerprint === state.fingerprint
  } catch {
    return false
  }
}

/** Embedded instances a finished test gave back, each reset before its next test; closed when the file's tests end. */
const spare: PGlite[] = []
let closingSpares = false
function keepSpare (client: PGlite): void {
  if (!closingSpares) {
    closingSpares = true
    tap.teardown(async () => { for (const spared of spare.splice(0)) await spared.close().catch(() => {}) })
  }
  spare.push(client)
}

/**
 * A migrated embedded instance of the test's own: a spare one reset (tens of milliseconds), or a
 * new one from the snapshot (about a second of CPU: the WASM Postgres starts and unpacks it).
 */
async function embeddedInstance (): Promise<PGlite> {
  for (let client = spare.pop(); client !== undefined; client = spare.pop()) {
    if (!client.closed && await reset(client, await describeMigrated(client))) return client
    if (!client.closed) await client.close().catch(() => {})
  }
  const client = await PGlite.create({ loadDataDir: await pgliteSnapshot(), startParams: START_PARAMS })
  await describeMigrated(client)
  return client
}

/** A fresh, migrated database of its own: PGlite from the snapshot, or a new PostgreSQL database. */
export async function freshDatabase (): Promise<TestDatabase> {
  if (!usingPostgres()) {
    const client = await embeddedInstance()
    const database = wrapPglite(client)
    let done = false
    return {
      // Closed by the test (a database gone away): that instance is not used again.
      database: { ...database, close: async () => { if (!done) { done = true; await database.close() } } },
      url: undefined,
      // Given back for the next test of this process, which finds it reset.
      drop: async () => {
        if (done) return
        done = true
        if (!client.closed) keepSpare(client)
      }
    }
  }
  const tpl = await postgresTemplate()
  const base = new URL(process.env.DATABASE_URL!).pathname.slice(1) || 'postgres'
  const name = `${base.slice(0, 30)}_t_${randomBytes(6).toString('hex')}`
  await admin(async (client) => {
    for (let attempt = 0; ; attempt++) {
      try {
        await client.query(`CREATE DATABASE "${name}" TEMPLATE "${tpl}"`)
        return
      } catch (err) {
        // Another process may be connected to the template for a moment while it checks it.
        if (attempt >= 20 || !/being accessed by other users/.test((err as Error).message)) throw err
        await new Promise((resolve) => setTimeout(resolve, 100))
      }
    }
  })
  const url = withDatabaseName(process.env.DATABASE_URL!, name)
  const database = await connectPostgres(url, 5)
  let closed = false
  const close = async () => { if (!closed) { closed = true; await database.close() } }
  return {
    database: { ...database, close },
    url,
    drop: async () => {
      await close()
      await admin(async (client) => { await client.query(`DROP DATABASE IF EXISTS "${name}" WITH (FORCE)`) })
    }
  }
}

/**
 * A fresh embedded data directory for a child process, unpacked from the snapshot, its
 * postgresql.auto.conf giving the child's PGlite the same small buffer pool as the tests' own
 * instances (as an operator's setting would: the service reads it at start).
 */
export async function freshDataDir (dir: string): Promise<void> {
  const client = await PGlite.create(dir, { loadDataDir: await pgliteSnapshot(), startParams: START_PARAMS })
  await client.close()
  appendFileSync(join(dir, 'postgresql.auto.conf'), "shared_buffers = '16MB'\n")
}

/** A new, empty PostgreSQL database (no migrations), dropped by the returned function. */
export async function emptyPostgresDatabase (): Promise<{ url: string, drop(): Promise<void> }> {
  const base = new URL(process.env.DATABASE_URL!).pathname.slice(1) || 'postgres'
  const name = `${base.slice(0, 30)}_e_${randomBytes(6).toString('hex')}`
  await admin(async (client) => { await client.query(`CREATE DATABASE "${name}"`) })
  return {
    url: withDatabaseName(process.env.DATABASE_URL!, name),
    drop: () => admin(async (client) => { await client.query(`DROP DATABASE IF EXISTS "${name}" WITH (FORCE)`) })
  }
}
