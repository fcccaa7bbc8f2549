import t from 'tap'
import { build } from '../../helper.js'

t.test('GET /v2/user/:user answers the test bot with bot: true', async (t) => {
  const { as } = await build(t)
  const alice = await as('alice')
  const res = await alice.get('/v2/user/testbot')
  t.equal(res.statusCode, 200)
  t.match(res.json(), { address: 'testbot', bot: true, displayName: 'Test bot' })
  t.match(res.json().createdAt, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/)
})

t.test('GET /v2/user/:user compares addresses case-insensitively', async (t) => {
  const { as, createUser } = await build(t)
  await createUser('bob@example.org', 'Bob')
  const res = await (await as('alice')).get('/v2/user/Bob@Example.ORG')
  t.equal(res.statusCode, 200)
  t.same(Object.keys(res.json()).sort(), ['address', 'bot', 'createdAt', 'displayName'])
  t.match(res.json(), { address: 'bob@example.org', displayName: 'Bob', bot: false })
})

t.test('GET /v2/user/:user answers 404 NOT_FOUND naming an unknown user', async (t) => {
  const { as } = await build(t)
  const res = await (await as('alice')).get('/v2/user/nobody')
  t.equal(res.statusCode, 404)
  t.same(res.json(), { statusCode: 404, error: 'Not Found', message: 'user nobody not found', code: 'NOT_FOUND' })
})

t.test('GET /v2/user/:user answers 400 VALIDATION_FAILED for a malformed address', async (t) => {
  const { as } = await build(t)
  const res = await (await as('alice')).get('/v2/user/not_an_address')
  t.equal(res.statusCode, 400)
  t.match(res.json(), { statusCode: 400, error: 'Bad Request', code: 'VALIDATION_FAILED', message: /params\/user/ })
})

t.test('GET /v2/whoami names the user and key behind the credentials', async (t) => {
  const { app, as, createUser } = await build(t)
  await createUser('carol', 'Carol')
  const carol = await as('carol', { dailyQuota: 7 })
  const res = await carol.get('/v2/whoami')
  t.equal(res.statusCode, 200)
  t.match(res.json(), { user: { address: 'carol', displayName: 'Carol', bot: false }, keyId: carol.keyId, dailyQuota: 7 })
  const anonymous = await app.inject({ method: 'GET', url: '/v2/whoami' })
  t.equal(anonymous.statusCode, 401)
})
