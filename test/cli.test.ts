import { existsSync, readFileSync } from 'node:fs'
import { join } from 'node:path'
import t from 'tap'
import { emptyPostgresDatabase, usingPostgres } from './support/databases.js'
import { childDatabaseEnv, openedForCli, runCli, runCliInProcess, startServer, tempDir } from './support/processes.js'
import type { TestContext } from './helper.js'

const JOURNAL = (JSON.parse(readFileSync('migrations/meta/_journal.json', 'utf8')) as { entries: { tag: string, when: number }[] }).entries
const ALL_MIGRATIONS = JOURNAL.map((e) => e.tag)

t.test('each migration is dated after the one before it', async (t) => {
  // A database applies the migrations dated after the newest it has (src/db/migrate.ts), so one
  // dated earlier than its predecessor would never be applied where that one was. drizzle-kit
  // dates a new one by the clock: set its "when" by hand if the last is dated ahead.
  for (let i = 1; i < JOURNAL.length; i++) {
    t.ok(JOURNAL[i]!.when > JOURNAL[i - 1]!.when, `${JOURNAL[i]!.tag} is dated after ${JOURNAL[i - 1]!.tag}`)
  }
})

const backend = usingPostgres() ? 'PostgreSQL' : 'embedded PGlite'

/** Environment for a `parley` child on an empty database. */
async function emptyEnv (t: TestContext): Promise<Record<string, string>> {
  if (usingPostgres()) {
    const empty = await emptyPostgresDatabase()
    t.teardown(() => empty.drop())
    return { DATABASE_URL: empty.url }
  }
  return { DATA_DIR: join(tempDir(t), 'data') }
}

t.test(`parley migrate applies every migration once, then nothing (${backend})`, async (t) => {
  const env = await emptyEnv(t)
  const first = await runCli(['migrate', '--json'], env)
  t.equal(first.code, 0, first.stderr)
  t.same(JSON.parse(first.stdout), { applied: ALL_MIGRATIONS, sealed: 0 })
  t.match(ALL_MIGRATIONS, ['0000_init', '0001_seed_testbot'])
  const second = await runCliInProcess(['migrate'], env)
  t.equal(second.code, 0, second.stderr)
  t.match(second.stdout, /Nothing to apply/)
  const users = await runCliInProcess(['user', 'list', '--json'], env)
  t.match(JSON.parse(users.stdout), [{ address: 'testbot', bot: true }], 'the migrations create the test bot')
})

t.test('parley migrate run twice at once applies each migration exactly once (PostgreSQL)', {
  skip: usingPostgres() ? false : 'needs DATABASE_URL: the embedded database admits one process'
}, async (t) => {
  const env = await emptyEnv(t)
  const runs = await Promise.all([runCli(['migrate', '--json'], env), runCli(['migrate', '--json'], env), runCli(['migrate', '--json'], env)])
  for (const run of runs) t.equal(run.code, 0, run.stderr)
  const applied = runs.flatMap((run) => (JSON.parse(run.stdout) as { applied: string[] }).applied).sort()
  t.same(applied, ALL_MIGRATIONS)
})

t.test('other commands refuse an unmigrated PostgreSQL with a clear line', {
  skip: usingPostgres() ? false : 'the embedded database migrates itself'
}, async (t) => {
  const env = await emptyEnv(t)
  const res = await runCliInProcess(['user', 'list'], env)
  t.equal(res.code, 1)
  t.equal(res.stderr, `parley: the database schema is behind (${ALL_MIGRATIONS.length} migration(s) pending); run \`parley migrate\` first\n`)
})

t.test(`parley user and key commands (${backend})`, async (t) => {
  const env = await childDatabaseEnv(t)
  // One database for all the commands (each opening it is tested above and in embedded-lock).
  const database = await openedForCli(t, env)
  const created = await runCliInProcess(['user', 'create', 'Alice', '--name', 'Alice Liddell', '--json'], env, database)
  t.equal(created.code, 0, created.stderr)
  t.match(JSON.parse(created.stdout), { address: 'alice', displayName: 'Alice Liddell', bot: false })

  const again = await runCliInProcess(['user', 'create', 'alice'], env, database)
  t.equal(again.code, 1)
  t.equal(again.stderr, 'parley: user alice already exists\n')

  const bad = await runCliInProcess(['user', 'create', 'not_valid'], env, database)
  t.equal(bad.code, 2)
  t.match(bad.stderr, /^parley: address "not_valid" must be 1-64 characters/)

  // A name with a bidi override (or any invisible formatting character) would read as another.
  for (const name of ['Alice\u202Eecil', 'Bob\u2066', 'Mallory\u200F', 'x\u061Cy', 'zero\u200Bwidth', '']) {
    const spoof = await runCliInProcess(['user', 'create', 'spoof', '--name', name], env, database)
    t.equal(spoof.code, 2, JSON.stringify(name))
    t.match(spoof.stderr, /^parley: --name must not (contain invisible, control or bidirectional formatting characters \(found U\+[0-9A-F]{4}\)|be empty)\n$/)
  }
  t.equal((await runCliInProcess(['user', 'list', '--json'], env, database)).stdout.includes('spoof'), false, 'no such user was made')

  const list = await runCliInProcess(['user', 'list'], env, database)
  t.match(list.stdout, /ADDRESS\s+NAME\s+BOT\s+CREATED\nalice\s+Alice Liddell\s+no\s+\S+\ntestbot\s+Test bot\s+yes/)

  const key = await runCliInProcess(['key', 'create', 'alice', '--json'], env, database)
  t.equal(key.code, 0, key.stderr)
  const { keyId, secret } = JSON.parse(key.stdout) as { keyId: string, secret: string }
  t.same(Object.keys(JSON.parse(key.stdout)), ['keyId', 'secret'])
  t.match(keyId, /^key_[0-9a-z]+$/)
  t.match(secret, /^sk_/)

  const text = await runCliInProcess(['key', 'create', 'alice', '--daily-quota', '5'], env, database)
  t.match(text.stdout, /key id:\s+key_\w+\n\s+secret:\s+sk_/)

  const noUser = await runCliInProcess(['key', 'create', 'nobody'], env, database)
  t.equal(noUser.code, 1)
  t.match(noUser.stderr, /user nobody does not exist/)

  const keys = await runCliInProcess(['key', 'list', 'alice', '--json'], env, database)
  const listed = JSON.parse(keys.stdout) as { keyId: string, dailyQuota: number | null, revokedAt: string | null }[]
  t.equal(listed.length, 2)
  t.match(listed, [{ keyId, address: 'alice', dailyQuota: null, revokedAt: null }, { dailyQuota: 5 }])
  t.notMatch(keys.stdout, secret, 'key list never shows secrets')
  t.notMatch((await runCliInProcess(['key', 'list'], env, database)).stdout, /sk_/)

  const quota = await runCliInProcess(['key', 'quota', keyId, '250', '--json'], env, database)
  t.equal(quota.code, 0, quota.stderr)
  t.match(JSON.parse(quota.stdout), { keyId, dailyQuota: 250 })
  const badQuota = await runCliInProcess(['key', 'quota', keyId, 'lots'], env, database)
  t.equal(badQuota.code, 2)
  t.match(badQuota.stderr, /N must be a whole number/)

  const admin = await runCliInProcess(['key', 'create', 'alice', '--scope', 'admin', '--scope', 'read', '--json'], env, database)
  t.equal(admin.code, 0, admin.stderr)
  const withAdmin = JSON.parse((await runCliInProcess(['key', 'list', 'alice', '--json'], env, database)).stdout) as { keyId: string, scopes: string[] }[]
  t.same(withAdmin.find((k) => k.keyId === JSON.parse(admin.stdout).keyId)?.scopes, ['admin', 'read'])
  const badScope = await runCliInProcess(['key', 'create', 'alice', '--scope', 'root'], env, database)
  t.equal(badScope.code, 2)
  t.equal(badScope.stderr, 'parley: --scope must be one of read, send, admin, got "root"\n')
  const off = await runCliInProcess(['user', 'deactivate', 'alice', '--json'], env, database)
  t.equal(off.code, 0, off.stderr)
  t.match(JSON.parse(off.stdout), { address: 'alice', deactivatedAt: /Z$/ })
  t.match((await runCliInProcess(['user', 'reactivate', 'alice'], env, database)).stdout, /Reactivated alice/)
  t.equal((await runCliInProcess(['user', 'deactivate', 'nobody'], env, database)).stderr, 'parley: user nobody not found\n')

  const revoked = await runCliInProcess(['key', 'revoke', keyId], env, database)
  t.equal(revoked.code, 0, revoked.stderr)
  t.match(revoked.stdout, new RegExp(`Revoked key ${keyId}`))
  t.match(JSON.parse((await runCliInProcess(['key', 'list', 'alice', '--json'], env, database)).stdout), [{ keyId, revokedAt: /Z$/ }])

  const unknown = await runCliInProcess(['key', 'revoke', 'key_nope'], env, database)
  t.equal(unknown.code, 1)
  t.equal(unknown.stderr, 'parley: key key_nope not found\n')

  const usage = await runCliInProcess(['frobnicate'], env, database)
  t.equal(usage.code, 2)
  t.match(usage.stderr, /unknown command "frobnicate"/)
  const help = await runCliInProcess(['--help'], env, database)
  t.equal(help.code, 0)
  t.match(help.stdout, /parley <command>/)
})

t.test('parley --version, per-command --help, and options checked per command', async (t) => {
  const env = { DATA_DIR: join(tempDir(t), 'data') }
  const pkg = JSON.parse(readFileSync('package.json', 'utf8')) as { version: string }
  // Through the real entry point, so the bundle's path to package.json is what is tested.
  const shown = await runCli(['--version'], env)
  t.equal(shown.code, 0, shown.stderr)
  t.equal(shown.stdout, `parley ${pkg.version}\n`)
  t.same(JSON.parse((await runCliInProcess(['--version', '--json'], env)).stdout), { version: pkg.version })

  const help = await runCliInProcess(['user', 'create', '--help'], env)
  t.equal(help.code, 0)
  t.equal(help.stdout, 'Usage: parley user create <address> [--name NAME]\n\nCreate a user.\n')

  const stray = await runCliInProcess(['user', 'list', '--daily-quota', '5'], env)
  t.equal(stray.code, 2)
  t.equal(stray.stderr, 'parley: parley user list takes no --daily-quota; usage: parley user list\n')
  const extra = await runCliInProcess(['migrate', 'now'], env)
  t.equal(extra.code, 2)
  t.match(extra.stderr, /parley migrate takes no arguments/)
  t.notOk(existsSync(env.DATA_DIR), 'a refused command opens no database')
})

t.test('a bad setting stops start-up with one line naming the variable', async (t) => {
  const res = await runCli(['serve'], { PORT: 'abc', DATA_DIR: join(tempDir(t), 'data') })
  t.equal(res.code, 1)
  t.equal(res.stderr, 'parley: Invalid configuration: PORT must be an integer from 0 to 65535 (got "abc")\n')
  const cli = await runCliInProcess(['user', 'list'], { DAILY_MESSAGE_QUOTA: 'many' })
  t.equal(cli.code, 1)
  t.match(cli.stderr, /^parley: Invalid configuration: DAILY_MESSAGE_QUOTA must be an integer/)
})

t.test('a key made with the CLI works against a server on PostgreSQL', {
  skip: usingPostgres() ? false : 'needs DATABASE_URL'
}, async (t) => {
  const env = await emptyEnv(t)
  t.equal((await runCliInProcess(['migrate'], env)).code, 0)
  t.equal((await runCliInProcess(['user', 'create', 'alice'], env)).code, 0)
  const { keyId, secret } = JSON.parse((await runCliInProcess(['key', 'create', 'alice', '--json'], env)).stdout) as { keyId: string, secret: string }
  const server = await startServer(t, env)
  const res = await fetch(`${server.url}/v2/user/testbot`, { headers: { authorization: `Basic ${Buffer.from(`${keyId}:${secret}`).toString('base64')}` } })
  t.equal(res.status, 200)
  t.match(await res.json(), { address: 'testbot', bot: true })
  t.notMatch(server.output(), /key id:/, 'no demo key on PostgreSQL')
  t.equal(await server.stop(), 0, 'SIGTERM stops it cleanly')
})

t.test('first start of an empty embedded database prints a demo key that works; later starts do not', {
  skip: usingPostgres() ? 'the embedded-database start is tested in the PGlite run' : false
}, async (t) => {
  const dataDir = join(tempDir(t), 'data')
  const first = await startServer(t, { DATA_DIR: dataDir }, 120_000)
  const banner = first.output()
  const curl = /curl -u (key_\w+):(sk_[\w-]+) -H 'Content-Type: application\/json' -d '\{"recipient":"testbot","body":"Hello, Parley!"\}' (http:\/\/127\.0\.0\.1:\d+)\/v2\/message/.exec(banner)
  t.ok(curl, 'prints a ready curl line with the key and the real port')
  const [, keyId, secret, base] = curl!
  t.equal(base, first.url)
  const authorization = `Basic ${Buffer.from(`${keyId}:${secret}`).toString('base64')}`
  const res = await fetch(`${first.url}/v2/user/testbot`, { headers: { authorization } })
  t.equal(res.status, 200)
  t.match(await res.json(), { address: 'testbot', bot: true })

  // What the printed curl line does: send the bot a message; its reply lands in demo's feed.
  const sent = await fetch(`${base}/v2/message`, {
    method: 'POST', headers: { authorization, 'content-type': 'application/json' }, body: '{"recipient":"testbot","body":"Hello, Parley!"}'
  })
  t.equal(sent.status, 200)
  const feed = await fetch(`${first.url}/v2/events?wait=5`, { headers: { authorization } })
  t.match(await feed.json(), { events: [{ type: 'message.received', data: { message: { sender: 'testbot', body: 'echo: Hello, Parley!' } } }] })

  const locked = await runCli(['user', 'list'], { DATA_DIR: dataDir })
  t.equal(locked.code, 1, 'the CLI stays out of a data directory the server holds')
  t.match(locked.stderr, /^parley: The embedded database in .* is in use by `parley serve` \(pid \d+\)/)
  t.equal(locked.stderr.split('\n').length, 2, 'one line')

  t.equal(await first.stop(), 0)
  const second = await startServer(t, { DATA_DIR: dataDir }, 120_000)
  t.notMatch(second.output(), /key id:|secret:/, 'no second demo key')
  await second.stop()
  const keys = JSON.parse((await runCliInProcess(['key', 'list', '--json'], { DATA_DIR: dataDir })).stdout) as unknown[]
  t.equal(keys.length, 1)
})
