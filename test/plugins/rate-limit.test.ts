import t from 'tap'
import { redisReachable } from '../support/redis.js'
import { buildApp } from '../../src/app.js'
import { RATE_LIMIT_MESSAGE } from '../../src/errors.js'
import { basic, build, testConfig } from '../helper.js'

const LIMITED = { statusCode: 429, error: 'Too Many Requests', message: 'Too many requests/second, please try again later', code: 'RATE_LIMITED' }

t.test('the contract text of the rate-limit message is exact', async (t) => {
  t.equal(RATE_LIMIT_MESSAGE, 'Too many requests/second, please try again later')
})

/**
 * A clock for the app's in-process limits that stands still until the test moves it: a burst
 * is all at one instant however long a busy machine takes over it (a real clock refills a
 * bucket of 5 a second by one place every 200 ms meanwhile).
 */
function stoppedClock () {
  let now = Date.now()
  return { now: () => now, advance: (ms: number) => { now += ms } }
}

t.test('a key past RATE_LIMIT_PER_SECOND answers 429 RATE_LIMITED with Retry-After; another key is unaffected', async (t) => {
  const clock = stoppedClock()
  const { as } = await build(t, { env: { RATE_LIMIT_PER_SECOND: '5' }, now: clock.now })
  const bob = await as('bob')
  const alice = await as('alice')
  const burst = await Promise.all(Array.from({ length: 8 }, () => alice.get('/v2/user/alice')))
  const statuses = burst.map((r) => r.statusCode).sort()
  t.same(statuses, [200, 200, 200, 200, 200, 429, 429, 429])
  const limited = burst.find((r) => r.statusCode === 429)!
  t.same(limited.json(), LIMITED)
  t.ok(Number(limited.headers['retry-after']) >= 1, 'Retry-After in seconds')
  t.equal(limited.headers['x-ratelimit-limit'], '5')
  t.equal(limited.headers['x-ratelimit-remaining'], '0')
  t.ok(limited.headers['x-ratelimit-reset'] !== undefined)
  const ok = burst.find((r) => r.statusCode === 200)!
  t.equal(ok.headers['x-ratelimit-limit'], '5')
  t.ok(Number(ok.headers['x-ratelimit-remaining']) < 5)

  t.equal((await bob.get('/v2/user/bob')).statusCode, 200, 'another key has its own budget')
  clock.advance(1_000)
  t.equal((await alice.get('/v2/user/alice')).statusCode, 200, 'the budget returns after a second')
})

t.test('unauthenticated requests are limited per IP', async (t) => {
  const { app, as } = await build(t, { env: { RATE_LIMIT_PER_SECOND: '3' }, now: stoppedClock().now })
  const alice = await as('alice')
  // alice is in use (so known to the process): a network's failures do not lock her key out.
  // Her request counts against her key, not against the network's budget below.
  t.equal((await app.inject({ method: 'GET', url: '/v2/user/alice', remoteAddress: '10.0.0.7', headers: { authorization: alice.authorization } })).statusCode, 200)
  const anonymous = await Promise.all(Array.from({ length: 5 }, () =>
    app.inject({ method: 'GET', url: '/v2/user/alice', remoteAddress: '10.0.0.7' })))
  t.same(anonymous.map((r) => r.statusCode).sort(), [401, 401, 401, 429, 429])
  t.same(anonymous.find((r) => r.statusCode === 429)!.json(), LIMITED)
  const withKey = await app.inject({ method: 'GET', url: '/v2/user/alice', remoteAddress: '10.0.0.7', headers: { authorization: alice.authorization } })
  t.equal(withKey.statusCode, 200, 'a verified key from the same IP has its own budget')
})

t.test('routes outside /v2 are not rate limited', async (t) => {
  const { app } = await build(t, { env: { RATE_LIMIT_PER_SECOND: '1' } })
  const res = await Promise.all(Array.from({ length: 3 }, () => app.inject({ method: 'GET', url: '/healthz' })))
  t.same(res.map((r) => r.statusCode), [200, 200, 200])
  t.equal(res[0]!.headers['x-ratelimit-limit'], undefined)
})

const redisUp = await redisReachable()

t.test('with REDIS_URL, two instances share one limit per key', {
  skip: redisUp ? false : 'no Redis on 127.0.0.1:6379: shared rate limits not tested here'
}, async (t) => {
  const env = { RATE_LIMIT_PER_SECOND: '4', REDIS_URL: 'redis://127.0.0.1:6379' }
  const first = await build(t, { env })
  const second = await buildApp({ config: testConfig(env), database: first.database })
  t.teardown(() => second.close())
  await second.ready()
  const { keyId, secret } = await first.as('alice')
  const headers = { authorization: basic(keyId, secret) }
  const answers = await Promise.all(Array.from({ length: 8 }, (_, i) =>
    (i % 2 === 0 ? first.app : second).inject({ method: 'GET', url: '/v2/user/alice', headers })))
  t.same(answers.map((r) => r.statusCode).sort(), [200, 200, 200, 200, 429, 429, 429, 429])
})

t.test('past RATE_LIMIT_PER_SECOND failed authentications, a network\'s made-up key ids cost no database lookup', async (t) => {
  // One second's window however long the 50 requests take.
  const { app, as, createKey } = await build(t, { env: { RATE_LIMIT_PER_SECOND: '5' }, now: stoppedClock().now })
  const alice = await as('alice')
  await app.inject({ method: 'GET', url: '/v2/whoami', remoteAddress: '10.0.0.9', headers: { authorization: alice.authorization } })
  const bogus = () => `Basic ${Buffer.from(`key_${Math.random().toString(36).slice(2).padEnd(26, '0').slice(0, 26)}:sk_nothing`).toString('base64')}`
  let lookups = 0
  const original = app.authenticator.authenticate
  app.authenticator.authenticate = async (id, secret) => {
    if (!app.authenticator.isCached(id)) lookups++
    return original(id, secret)
  }
  const answers: number[] = []
  for (let i = 0; i < 50; i++) answers.push((await app.inject({ method: 'GET', url: '/v2/whoami', remoteAddress: '10.0.0.9', headers: { authorization: bogus() } })).statusCode)
  t.ok(lookups <= 5, `${lookups} lookups for 50 made-up ids in one second`)
  t.same([...new Set(answers)].sort(), [401, 429])
  t.equal((await app.inject({ method: 'GET', url: '/v2/whoami', remoteAddress: '10.0.0.9', headers: { authorization: alice.authorization } })).statusCode, 200,
    'a key already in use from that network still works')
  t.equal((await app.inject({ method: 'GET', url: '/v2/whoami', remoteAddress: '10.0.0.10', headers: { authorization: basicOf(await createKey('alice')) } })).statusCode, 200,
    'another network is not affected')
})

function basicOf (key: { keyId: string, secret: string }): string {
  return `Basic ${Buffer.from(`${key.keyId}:${key.secret}`).toString('base64')}`
}

t.test('with REDIS_URL unreachable, each instance still limits (it does not turn the limit off)', async (t) => {
  const { app, as } = await build(t, { env: { RATE_LIMIT_PER_SECOND: '4', REDIS_URL: 'redis://127.0.0.1:1' } })
  const alice = await as('alice')
  const answers = await Promise.all(Array.from({ length: 8 }, () => alice.get('/v2/user/alice')))
  t.same(answers.map((r) => r.statusCode).sort(), [200, 200, 200, 200, 429, 429, 429, 429])
  t.same(answers.find((r) => r.statusCode === 429)!.json(), LIMITED)
  void app
})

t.test('unauthenticated clients are counted per IPv6 /64 (rotating within it escapes nothing), IPv4 as itself', async (t) => {
  const { clientNetwork } = await import('../../src/plugins/rate-limit.js')
  t.equal(clientNetwork('2001:db8:1:2:aaaa::1'), '2001:db8:1:2::/64')
  t.equal(clientNetwork('2001:db8:1:2:ffff:ffff:ffff:fffe'), '2001:db8:1:2::/64')
  t.equal(clientNetwork('2001:db8::1'), '2001:db8:0:0::/64')
  t.equal(clientNetwork('::ffff:192.0.2.7'), '192.0.2.7')
  t.equal(clientNetwork('192.0.2.7'), '192.0.2.7')
  const { app } = await build(t, { env: { RATE_LIMIT_PER_SECOND: '3' }, now: stoppedClock().now })
  const answers = await Promise.all(Array.from({ length: 6 }, (_, i) =>
    app.inject({ method: 'GET', url: '/v2/user/alice', remoteAddress: `2001:db8:7:7::${(i + 1).toString(16)}` })))
  t.same(answers.map((r) => r.statusCode).sort(), [401, 401, 401, 429, 429, 429], 'six addresses of one /64 share one budget')
})

t.test('unknown /v2 paths are limited and carry the limiter\'s headers like any other', async (t) => {
  const { as } = await build(t, { env: { RATE_LIMIT_PER_SECOND: '2' }, now: stoppedClock().now })
  const alice = await as('alice')
  const answers = await Promise.all(Array.from({ length: 3 }, () => alice.get('/v2/no/such/route')))
  t.same(answers.map((r) => r.statusCode).sort(), [404, 404, 429])
  for (const res of answers) t.ok(res.headers['x-ratelimit-limit'] !== undefined, `${res.statusCode} carries X-RateLimit-Limit`)
})
