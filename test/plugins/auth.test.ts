import { createHash } from 'node:crypto'
import t from 'tap'
import { sql } from 'drizzle-orm'
import { queryRows } from '../../src/db/rows.js'
import { createKeysRepository } from '../../src/modules/keys/keys.repository.js'
import { createAuthenticator, KEY_CACHE_MS, KNOWN_KEY_MS } from '../../src/modules/keys/authenticator.js'
import { basic, build } from '../helper.js'

const UNAUTHORIZED = { statusCode: 401, error: 'Unauthorized', code: 'UNAUTHORIZED' }

t.test('/v2 routes answer 401 with WWW-Authenticate for missing, malformed, unknown and wrong credentials', async (t) => {
  const { app, createKey, createUser } = await build(t)
  await createUser('alice')
  const key = await createKey('alice')
  const cases: Record<string, string | undefined> = {
    missing: undefined,
    'not basic': `Bearer ${key.secret}`,
    'not base64': 'Basic !!!',
    'no colon': `Basic ${Buffer.from(key.keyId).toString('base64')}`,
    'unknown key id': basic('key_doesnotexist', key.secret),
    'wrong secret': basic(key.keyId, `${key.secret}x`),
    'empty secret': basic(key.keyId, ''),
    'secret of another length': basic(key.keyId, 'short')
  }
  for (const [name, authorization] of Object.entries(cases)) {
    const res = await app.inject({ method: 'GET', url: '/v2/user/alice', headers: authorization === undefined ? {} : { authorization } })
    t.equal(res.statusCode, 401, name)
    t.equal(res.headers['www-authenticate'], 'Basic realm="parley"', `${name}: challenge`)
    t.match(res.json(), UNAUTHORIZED, `${name}: body`)
  }
  const ok = await app.inject({ method: 'GET', url: '/v2/user/alice', headers: { authorization: basic(key.keyId, key.secret) } })
  t.equal(ok.statusCode, 200)
})

t.test('a revoked key is refused within 5 seconds', async (t) => {
  // The key cache's clock, moved by the test: the cache trusts what it read for KEY_CACHE_MS.
  let clock = Date.now()
  const { as, db } = await build(t, { now: () => clock })
  const alice = await as('alice')
  t.equal((await alice.get('/v2/user/alice')).statusCode, 200)
  await createKeysRepository(db).revoke(alice.keyId)
  t.ok(KEY_CACHE_MS <= 5_000, `a key is trusted from the cache for ${KEY_CACHE_MS} ms`)
  clock += KEY_CACHE_MS
  const res = await alice.get('/v2/user/alice')
  t.equal(res.statusCode, 401)
  t.match(res.json(), UNAUTHORIZED)
  t.equal(res.headers['www-authenticate'], 'Basic realm="parley"')
})

t.test('a key created a moment ago works at once', async (t) => {
  const { app, createKey, createUser } = await build(t)
  await createUser('bob')
  const unknown = await app.inject({ method: 'GET', url: '/v2/user/bob', headers: { authorization: basic('key_x', 'y') } })
  t.equal(unknown.statusCode, 401)
  const key = await createKey('bob')
  const res = await app.inject({ method: 'GET', url: '/v2/user/bob', headers: { authorization: basic(key.keyId, key.secret) } })
  t.equal(res.statusCode, 200)
})

t.test('secrets are stored only as SHA-256 and are at least 32 random bytes', async (t) => {
  const { createKey, createUser, db } = await build(t)
  await createUser('alice')
  const key = await createKey('alice')
  t.match(key.secret, /^sk_[A-Za-z0-9_-]{43,}$/)
  t.ok(Buffer.from(key.secret.slice(3), 'base64url').length >= 32)
  const [row] = await queryRows<Record<string, unknown>>(db, sql`SELECT * FROM api_keys WHERE id = ${key.keyId}`)
  t.equal(row!.secret_hash, createHash('sha256').update(key.secret).digest('hex'))
  const dump = JSON.stringify(await queryRows(db, sql`SELECT * FROM api_keys`))
  t.notMatch(dump, key.secret, 'the secret appears nowhere in the table')
  t.notMatch(dump, key.secret.slice(3))
  const other = await createKey('alice')
  t.not(other.secret, key.secret)
})

t.test('the Authorization header and secrets never reach the log', async (t) => {
  const { app, as, logs } = await build(t, { env: { LOG_LEVEL: 'trace' } })
  const alice = await as('alice')
  await alice.get('/v2/user/alice')
  await app.inject({ method: 'GET', url: '/v2/user/alice', headers: { authorization: basic(alice.keyId, 'wrong-secret-123') } })
  // A log line that does include the headers, as a debugging aid or a plugin might write.
  app.log.info({ req: { headers: { authorization: alice.authorization } }, headers: { authorization: alice.authorization } }, 'with headers')
  const text = logs()
  t.match(text, /with headers/)
  t.match(text, /\[redacted\]/)
  t.notMatch(text, alice.secret)
  t.notMatch(text, alice.authorization.slice(6), 'not even base64-encoded')
  t.notMatch(text, 'wrong-secret-123')
})

t.test('an unknown key id costs what a known one does: one lookup, then the cache (no timing oracle)', async (t) => {
  const { app, createKey, createUser } = await build(t)
  await createUser('bob')
  const known = await createKey('bob')
  const unknown = 'key_' + 'z'.repeat(26)
  for (const [id, secret] of [[known.keyId, 'sk_wrong'], [unknown, 'sk_wrong']] as const) {
    t.notOk(app.authenticator.isCached(id), `${id === unknown ? 'unknown' : 'known'} id: not looked up yet`)
    const res = await app.inject({ method: 'GET', url: '/v2/whoami', headers: { authorization: basic(id, secret) } })
    t.equal(res.statusCode, 401)
    t.ok(app.authenticator.isCached(id), `${id === unknown ? 'unknown' : 'known'} id: answered from the cache from now on`)
  }
})

t.test('a key that authenticated stays known for KNOWN_KEY_MS after its cache entry runs out; wrong secrets never make one known', async (t) => {
  const { db, createKey, createUser } = await build(t)
  await createUser('bob')
  const key = await createKey('bob')
  let clock = 1_000_000
  const authenticator = createAuthenticator(db, 100, () => clock)
  t.notOk(authenticator.isKnown(key.keyId), 'not known before it is used')
  t.notOk(await authenticator.authenticate(key.keyId, 'sk_wrong'), 'a wrong secret fails')
  clock += KEY_CACHE_MS + 1
  t.notOk(authenticator.isKnown(key.keyId), 'and did not make the id known')
  t.ok(await authenticator.authenticate(key.keyId, key.secret), 'the right secret works')
  clock += KEY_CACHE_MS + 1
  t.notOk(authenticator.isCached(key.keyId), 'the cache entry ran out')
  t.ok(authenticator.isKnown(key.keyId), 'but the id is still known')
  clock += KNOWN_KEY_MS
  t.notOk(authenticator.isKnown(key.keyId), `forgotten ${KNOWN_KEY_MS / 60_000} minutes after its last success`)
})

t.test('keys authenticating at once (their look-ups gathered) each get their own answer: the right secret, a wrong one, a revoked key, an unknown id', async (t) => {
  const { db, createKey, createUser } = await build(t)
  const keys = []
  for (let i = 0; i < 12; i++) {
    await createUser(`user${i}`)
    keys.push(await createKey(`user${i}`))
  }
  await createKeysRepository(db).revoke(keys[11]!.keyId)
  const authenticator = createAuthenticator(db, 100)
  const answers = await Promise.all([
    ...keys.map((k) => authenticator.authenticate(k.keyId, k.secret)),
    authenticator.authenticate(keys[0]!.keyId, 'sk_wrong'),
    authenticator.authenticate('key_unknown', keys[0]!.secret)
  ])
  t.same(answers.slice(0, 11).map((p) => p?.address), keys.slice(0, 11).map((_, i) => `user${i}`), 'each key is its own user')
  t.same(answers.slice(11), [undefined, undefined, undefined], 'a revoked key, a wrong secret and an unknown id are refused')
  for (const k of [...keys, { keyId: 'key_unknown' }]) t.ok(authenticator.isCached(k.keyId), `${k.keyId} answered and cached`)
})
