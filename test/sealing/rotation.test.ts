import { spawn } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { existsSync, readFileSync, rmSync, statSync } from 'node:fs'
import { join } from 'node:path'
import { sql } from 'drizzle-orm'
import t from 'tap'
import { openDatabase, type Database } from '../../src/db/client.js'
import { queryRows } from '../../src/db/rows.js'
import { installKeyring, Keyring, parseSealingKeys } from '../../src/sealing/keyring.js'
import { openText, record } from '../../src/sealing/records.js'
import { basic } from '../helper.js'
import { p99, sendLoop } from '../support/bystander.js'
import { usingPostgres } from '../support/databases.js'
import { childDatabaseEnv, childEnv, runCli, runCliInProcess, startServer } from '../support/processes.js'
import { until } from '../support/until.js'

const K1 = `k1:${randomBytes(32).toString('hex')}`
const K2 = `k2:${randomBytes(32).toString('hex')}`
const BIN = join(import.meta.dirname, '..', '..', 'bin', 'parley.js')
/** Messages written straight into the table, plain, so that the passes have pages enough to be cut in the middle of. */
const BULK = 5_000

/** The child's database, opened here while no child holds it (the embedded one admits one process). */
async function withDatabase<T> (env: Record<string, string>, fn: (database: Database) => Promise<T>): Promise<T> {
  const database = await openDatabase({ databaseUrl: env.DATABASE_URL, dataDir: env.DATA_DIR ?? '', command: 'test', poolSize: 2 })
  try {
    return await fn(database)
  } finally {
    await database.close()
  }
}

interface Key { keyId: string, secret: string }

t.test('rotate under load, kill -9 midway, resume, drop the old key: everything reads back identical; a record under the dropped key answers 503', async (t) => {
  const env = { ...await childDatabaseEnv(t), RATE_LIMIT_PER_SECOND: '1000', DAILY_MESSAGE_QUOTA: '100000' }
  const withKeys = (keys: string) => ({ ...env, SEALING_KEYS: keys })
  for (const user of ['alice', 'bob']) t.equal((await runCliInProcess(['user', 'create', user], withKeys(K1))).code, 0)
  const keyOf = async (user: string) => JSON.parse((await runCliInProcess(['key', 'create', user, '--json'], withKeys(K1))).stdout) as Key
  const [alice, bob] = [await keyOf('alice'), await keyOf('bob')]
  await withDatabase(env, async ({ db }) => {
    await queryRows(db, sql`INSERT INTO messages (id, sender, recipient, body)
      SELECT 'msg_bulk' || lpad(g::text, 6, '0'), 'alice', 'bob', 'bulk message number ' || g FROM generate_series(1, ${BULK}) AS g`)
  })

  // Filled through the API under k1; the start seals the bulk rows under k1 in the background.
  let server = await startServer(t, withKeys(K1))
  const call = async (key: Key, path: string, init: RequestInit = {}) =>
    fetch(`${server.url}${path}`, { ...init, headers: { authorization: basic(key.keyId, key.secret), ...init.headers } })
  const bodies = new Map<string, string>()
  for (let i = 0; i < 30; i++) {
    const body = `message ${i} ünïcødé ✓ ${randomBytes(8).toString('hex')}`
    const res = await call(alice, '/v2/message', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ recipient: 'bob', body }) })
    t.equal(res.status, 200)
    bodies.set(((await res.json()) as { id: string }).id, body)
  }
  const files = new Map<string, { bytes: Buffer, filename: string, type: string }>()
  for (const size of [300 * 1024, 2_000]) {
    const bytes = randomBytes(size)
    const form = new FormData()
    form.append('recipient', 'bob')
    form.append('body', `a file of ${size} bytes`)
    form.append('attachment', new Blob([new Uint8Array(bytes)], { type: 'application/x-test' }), `file-${size}.bin`)
    const res = await call(alice, '/v2/message', { method: 'POST', body: form })
    t.equal(res.status, 200)
    const id = ((await res.json()) as { id: string }).id
    files.set(id, { bytes, filename: `file-${size}.bin`, type: 'application/x-test' })
    bodies.set(id, `a file of ${size} bytes`)
  }
  const metadata = new Map<string, Record<string, unknown>>()
  for (const id of [...bodies.keys()].slice(0, 10)) {
    const map = { label: `label of ${id}`, n: 7, nested: { ok: true } }
    t.equal((await call(alice, `/v2/metadata/${id}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(map) })).status, 200)
    metadata.set(id, map)
  }
  await until(() => /sealed the records written before sealing/.test(server.output()), { timeoutMs: 120_000, message: 'the start pass sealed the bulk rows' })
  t.equal(await server.stop(), 0)

  // The rotation: k2 seals, k1 still opens. On PostgreSQL the service runs meanwhile and a
  // bystander sends; the embedded database admits one process, so it is rotated offline.
  let bystander: ReturnType<typeof sendLoop> | undefined
  if (usingPostgres()) {
    server = await startServer(t, withKeys(`${K2},${K1}`))
    bystander = sendLoop([server.url], basic(alice.keyId, alice.secret), ['bob'], 20)
  }
  const first = spawn(process.execPath, [BIN, 'seal', 'rotate'], { env: childEnv(withKeys(`${K2},${K1}`)), stdio: ['ignore', 'pipe', 'pipe'] })
  let progress = ''
  first.stderr.on('data', (chunk: Buffer) => { progress += chunk.toString() })
  const exited = new Promise<number | null>((resolve) => first.on('exit', (code) => resolve(code)))
  // Killed well into it, with some but not all sealed: a progress line between 30 and 89 %.
  await until(() => /sealing: [1-9]\d*\/\d+ \([3-8]\d%\)/.test(progress), { timeoutMs: 120_000, intervalMs: 10, message: `rotation under way (${progress})` })
  first.kill('SIGKILL')
  t.equal(await exited, null, 'killed')

  const second = await runCli(['seal', 'rotate'], withKeys(`${K2},${K1}`))
  t.equal(second.code, 0, second.stderr)
  t.match(second.stdout, /Key k1 can be dropped from SEALING_KEYS now\./)
  if (bystander !== undefined) {
    const sent = await bystander.stop()
    t.ok(sent.length > 20, `${sent.length} bystander sends`)
    t.ok(sent.every((s) => s.status === 200), 'every bystander send succeeded')
    t.ok(p99(sent.map((s) => s.ms)) < 250, `bystander p99 ${p99(sent.map((s) => s.ms)).toFixed(0)} ms during the rotation`)
    t.equal(await server.stop(), 0)
  }
  const status = await runCli(['seal', 'status', '--json'], withKeys(K2))
  t.equal(status.code, 0, status.stderr)
  const tables = (JSON.parse(status.stdout) as { tables: { table: string, plain: number, byKey: Record<string, number> }[] }).tables
  for (const table of tables) t.same(Object.keys(table.byKey).filter((id) => id !== 'k2'), [], `${table.table}: nothing left under k1`)
  t.same(tables.map((table) => table.plain), [0, 0, 0, 0, 0], 'nothing plain')

  // The bulk rows, opened here under k2 alone.
  installKeyring(new Keyring(parseSealingKeys(K2)))
  await withDatabase(env, async ({ db }) => {
    const rows = await queryRows<{ id: string, body: string, sealed_by: string }>(db, sql`SELECT id, body, sealed_by FROM messages WHERE id LIKE 'msg_bulk%' ORDER BY id`)
    t.equal(rows.length, BULK)
    t.ok(rows.every((row, i) => row.sealed_by === 'k2' && openText(row.body, record.messageBody(row.id), 'k2') === `bulk message number ${i + 1}`), 'every bulk message under k2, as written')
  })

  // k1 dropped: every message, file and metadata value reads back through the API as written.
  server = await startServer(t, withKeys(K2))
  for (const [id, body] of bodies) {
    const res = await call(bob, `/v2/message/${id}`)
    t.equal(res.status, 200)
    t.equal(((await res.json()) as { body: string }).body, body, `${id}'s body`)
  }
  for (const [id, file] of files) {
    const res = await call(bob, `/v2/message/${id}/attachment/1`)
    t.equal(res.status, 200)
    t.equal(res.headers.get('content-type'), file.type)
    t.match(res.headers.get('content-disposition') ?? '', file.filename)
    t.ok(Buffer.from(await res.arrayBuffer()).equals(file.bytes), `${file.filename}: the same bytes`)
  }
  for (const [id, map] of metadata) {
    const res = await call(bob, `/v2/metadata/${id}`)
    t.equal(res.status, 200)
    t.same(((await res.json()) as { metadata: unknown }).metadata, map, `${id}'s metadata`)
  }
  t.equal(await server.stop(), 0)

  // One record put back under k1, which SEALING_KEYS no longer holds: 503 naming it, the rest unharmed.
  const [lostId, lostMap] = [...metadata][0]!
  const underK1 = new Keyring(parseSealingKeys(K1)).sealText(JSON.stringify(lostMap), record.metadata(lostId))
  await withDatabase(env, async ({ db }) => {
    await queryRows(db, sql`UPDATE metadata SET data = to_jsonb(${underK1}::text), sealed_by = 'k1' WHERE entity = ${lostId}`)
  })
  server = await startServer(t, withKeys(K2))
  const lost = await call(bob, `/v2/metadata/${lostId}`)
  t.equal(lost.status, 503)
  t.match(await lost.json(), { code: 'SEALED_KEY_MISSING', message: /"k1"/ })
  t.equal((await call(bob, `/v2/metadata/${[...metadata.keys()][1]!}`)).status, 200, 'the others read as before')
  t.equal(await server.stop(), 0)
})

t.test('a wrong key under a known id is refused at start with one line, and so is PostgreSQL without SEALING_KEYS', async (t) => {
  const env = await childDatabaseEnv(t)
  const server = await startServer(t, { ...env, SEALING_KEYS: K1 })
  t.equal(await server.stop(), 0)
  const wrong = await startServer(t, { ...env, SEALING_KEYS: `k1:${randomBytes(32).toString('hex')}` }).then(() => 'started', (err: Error) => err.message)
  t.match(wrong, /exited with 1 before listening/)
  t.match(wrong, /^parley: SEALING_KEYS: key k1 does not open this database's data: it is not the key this database was sealed with$/m)
  if (usingPostgres()) {
    const none = await runCli(['migrate'], { ...env, SEALING_KEYS: undefined })
    t.equal(none.code, 1)
    t.match(none.stderr, /^parley: SEALING_KEYS is not set: on PostgreSQL/)
    t.equal(none.stderr.split('\n').length, 2, 'one line')
  }
})

t.test('the embedded database makes its key file on first start (0600), says where, and uses it from then on', {
  skip: usingPostgres() ? 'the embedded database only' : false
}, async (t) => {
  const env = await childDatabaseEnv(t)
  const first = await runCli(['migrate'], { ...env, SEALING_KEYS: undefined })
  t.equal(first.code, 0, first.stderr)
  const keyFile = join(env.DATA_DIR!, 'sealing.key')
  t.match(first.stderr, `Generated a sealing key in ${keyFile} (mode 0600)`)
  t.equal(statSync(keyFile).mode & 0o777, 0o600)
  t.match(readFileSync(keyFile, 'utf8'), /^k1:[0-9a-f]{64}\n$/)
  const server = await startServer(t, { ...env, SEALING_KEYS: undefined })
  t.notMatch(server.output(), /Generated a sealing key/, 'made once')
  t.equal(await server.stop(), 0)

  // The key file lost: a new one would open nothing here, so none is kept and the start says why.
  rmSync(keyFile)
  const lost = await runCli(['migrate'], { ...env, SEALING_KEYS: undefined })
  t.equal(lost.code, 1)
  t.match(lost.stderr, `parley: ${keyFile} is missing, and this database was sealed under a key k1 that a new key cannot stand in for: restore the file from its backup`)
  t.notOk(existsSync(keyFile), 'no wrong key left in its place')
})

t.test('a plaintext database is sealed at start, online, and reads back identical', async (t) => {
  const env = await childDatabaseEnv(t)
  for (const user of ['alice', 'bob']) t.equal((await runCliInProcess(['user', 'create', user], { ...env, SEALING_KEYS: K1 })).code, 0)
  const bob = JSON.parse((await runCliInProcess(['key', 'create', 'bob', '--json'], { ...env, SEALING_KEYS: K1 })).stdout) as Key
  const { writePlainContent, readContent } = await import('./support.js')
  const written = await withDatabase(env, async ({ db }) => writePlainContent(db, 'x', 20))
  const server = await startServer(t, { ...env, SEALING_KEYS: K1, LOG_LEVEL: 'info' })
  await until(() => /sealed the records written before sealing/.test(server.output()), { timeoutMs: 60_000, message: 'the start pass ended' })
  t.equal((await fetch(`${server.url}/v2/whoami`, { headers: { authorization: basic(bob.keyId, bob.secret) } })).status, 200, 'the service answers')
  t.equal(await server.stop(), 0)
  installKeyring(new Keyring(parseSealingKeys(K1)))
  const read = await withDatabase(env, async ({ db }) => readContent(db, written))
  t.same(read.keys, new Set(['k1']))
  t.same(read.content, written)
})
