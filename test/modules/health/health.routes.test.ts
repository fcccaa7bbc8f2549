import t from 'tap'
import { build } from '../../helper.js'

t.test('GET /healthz answers 200 without credentials', async (t) => {
  const { app } = await build(t)
  const res = await app.inject({ method: 'GET', url: '/healthz' })
  t.equal(res.statusCode, 200)
  t.same(res.json(), { status: 'ok' })
})

t.test('GET /readyz answers 200 while the database answers, 503 UNAVAILABLE when it does not', async (t) => {
  const { app, database } = await build(t)
  const ready = await app.inject({ method: 'GET', url: '/readyz' })
  t.equal(ready.statusCode, 200)
  t.same(ready.json(), { status: 'ready' })
  await database.close()
  const down = await app.inject({ method: 'GET', url: '/readyz' })
  t.equal(down.statusCode, 503)
  t.match(down.json(), { statusCode: 503, error: 'Service Unavailable', code: 'UNAVAILABLE' })
})

t.test('GET /v2/openapi.json serves OpenAPI 3 from the route schemas, without credentials', async (t) => {
  const { app } = await build(t)
  const res = await app.inject({ method: 'GET', url: '/v2/openapi.json' })
  t.equal(res.statusCode, 200)
  const doc = res.json()
  t.match(doc.openapi, /^3\./)
  t.ok(doc.paths['/v2/user/{user}']?.get, 'documents GET /v2/user/{user}')
  t.match(doc.paths['/v2/user/{user}'].get.responses, { 200: {}, 401: {}, 404: {} })
  t.same(doc.components.securitySchemes.basicAuth, { type: 'http', scheme: 'basic' })
  t.notOk(doc.paths['/v2/openapi.json'], 'the document does not list itself')
})

t.test('GET /docs serves the OpenAPI UI', async (t) => {
  const { app } = await build(t)
  const res = await app.inject({ method: 'GET', url: '/docs/' })
  t.equal(res.statusCode, 200)
  t.match(res.headers['content-type'], /text\/html/)
})
