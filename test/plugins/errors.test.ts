import type { FastifyInstance } from 'fastify'
import t from 'tap'
import { Type } from 'typebox'
import { sql } from 'drizzle-orm'
import { Forbidden } from '../../src/errors.js'
import { build } from '../helper.js'

/** Routes that exercise the shared plugins the way the resource routes will. */
function probeRoutes (db: () => import('../../src/db/client.js').Db) {
  return async (app: FastifyInstance) => {
    await app.register(async (v2) => {
      const { authPlugin } = await import('../../src/plugins/auth.js')
      await v2.register(authPlugin, { authenticator: app.authenticator, failuresPerSecond: 20 })
      v2.post('/probe/echo', {
        schema: {
          body: Type.Object({
            name: Type.String({ minLength: 1 }),
            tags: Type.Optional(Type.Array(Type.String())),
            count: Type.Optional(Type.Integer())
          })
        }
      }, async (req) => req.body)
      v2.get('/probe/forbidden', async () => { throw new Forbidden('group grp_x is visible to its members only') })
      v2.get('/probe/sql', async () => db().execute(sql`SELECT * FROM no_such_table WHERE secret = ${'hunter2'}`))
      v2.get('/probe/crash', async () => { throw new Error('internal detail at /srv/app.ts:12') })
    }, { prefix: '/v2' })
  }
}

async function setup (t: Parameters<typeof build>[0]) {
  // The routes read the database of the app they are built into: built is set before any request.
  const built: Awaited<ReturnType<typeof build>> = await build(t, { routes: probeRoutes(() => built.db) })
  return built
}

const isErrorBody = (body: Record<string, unknown>) =>
  typeof body.statusCode === 'number' && typeof body.error === 'string' && typeof body.message === 'string' && typeof body.code === 'string'

t.test('unknown routes answer 404 NOT_FOUND in JSON', async (t) => {
  const { app } = await setup(t)
  const res = await app.inject({ method: 'GET', url: '/v2/nowhere?x=1' })
  t.equal(res.statusCode, 404)
  t.match(res.headers['content-type'], /application\/json/)
  t.same(res.json(), { statusCode: 404, error: 'Not Found', message: 'route GET /v2/nowhere not found', code: 'NOT_FOUND' })
})

t.test('application errors answer their status and code: 403 FORBIDDEN', async (t) => {
  const { as } = await setup(t)
  const res = await (await as('alice')).get('/v2/probe/forbidden')
  t.equal(res.statusCode, 403)
  t.same(res.json(), { statusCode: 403, error: 'Forbidden', message: 'group grp_x is visible to its members only', code: 'FORBIDDEN' })
})

t.test('a database error answers 500 INTERNAL without SQL, parameters or stack', async (t) => {
  const { as, logs } = await setup(t)
  const alice = await as('alice')
  for (const url of ['/v2/probe/sql', '/v2/probe/crash']) {
    const res = await alice.get(url)
    t.equal(res.statusCode, 500, url)
    t.same(res.json(), { statusCode: 500, error: 'Internal Server Error', message: 'Internal server error', code: 'INTERNAL' })
    t.notMatch(res.body, /no_such_table|hunter2|SELECT|\/srv\/app\.ts|at /)
  }
  t.match(logs(), /no_such_table/, 'the cause is logged for operators')
  t.notMatch(logs(), /hunter2/, 'but not the query\'s parameters')
})

t.test('validation errors answer 400 VALIDATION_FAILED naming the field', async (t) => {
  const { as } = await setup(t)
  const alice = await as('alice')
  const missing = await alice.post('/v2/probe/echo', { tags: ['a'] })
  t.equal(missing.statusCode, 400)
  t.match(missing.json(), { code: 'VALIDATION_FAILED', error: 'Bad Request', message: /name/ })
  const wrongType = await alice.post('/v2/probe/echo', { name: 'x', count: 'many' })
  t.match(wrongType.json(), { statusCode: 400, code: 'VALIDATION_FAILED', message: /count/ })
  const badJson = await alice.post('/v2/probe/echo', undefined, { headers: { 'content-type': 'application/json' } })
  t.equal(badJson.statusCode, 400)
  t.ok(isErrorBody(badJson.json()))
})

t.test('malformed JSON answers 400 with the error body', async (t) => {
  const { app, as } = await setup(t)
  const alice = await as('alice')
  const res = await app.inject({ method: 'POST', url: '/v2/probe/echo', headers: { authorization: alice.authorization, 'content-type': 'application/json' }, payload: '{"name": ' })
  t.equal(res.statusCode, 400)
  t.match(res.json(), { code: 'VALIDATION_FAILED', message: /body/ })
  const proto = await app.inject({ method: 'POST', url: '/v2/probe/echo', headers: { authorization: alice.authorization, 'content-type': 'application/json' }, payload: '{"name":"x","__proto__":{"admin":true}}' })
  t.equal(proto.statusCode, 400)
  t.match(proto.json(), { code: 'VALIDATION_FAILED' })
})

t.test('JSON, form and multipart bodies arrive as the same fields', async (t) => {
  const { as } = await setup(t)
  const alice = await as('alice')
  const json = await alice.post('/v2/probe/echo', { name: 'ops', tags: ['a', 'b'], count: 3 })
  t.same(json.json(), { name: 'ops', tags: ['a', 'b'], count: 3 })
  const form = await alice.post('/v2/probe/echo', { name: 'ops', tags: ['a', 'b'], count: '3' }, { format: 'form' })
  t.equal(form.statusCode, 200)
  t.same(form.json(), { name: 'ops', tags: ['a', 'b'], count: 3 }, 'repeated fields are a list, numbers coerced')
  const single = await alice.post('/v2/probe/echo', { name: 'ops', tags: 'solo' }, { format: 'form' })
  t.same(single.json(), { name: 'ops', tags: ['solo'] }, 'one occurrence is a one-element list')
})

t.test('multipart answers 415 on a route that takes no files', async (t) => {
  const { as } = await setup(t)
  const res = await (await as('alice')).post('/v2/probe/echo', { name: 'ops' }, { format: 'multipart' })
  t.equal(res.statusCode, 415)
  t.match(res.json(), { statusCode: 415, error: 'Unsupported Media Type', code: 'UNSUPPORTED_MEDIA_TYPE', message: /multipart\/form-data/ })
})

t.test('other content types answer 415 UNSUPPORTED_MEDIA_TYPE', async (t) => {
  const { app, as } = await setup(t)
  const alice = await as('alice')
  for (const type of ['text/plain', 'application/xml', 'application/octet-stream']) {
    const res = await app.inject({ method: 'POST', url: '/v2/probe/echo', headers: { authorization: alice.authorization, 'content-type': type }, payload: 'name=x' })
    t.equal(res.statusCode, 415, type)
    t.match(res.json(), { code: 'UNSUPPORTED_MEDIA_TYPE', message: new RegExp(type.replace('/', '\\/')) })
  }
})

t.test('bodies over 1 MiB answer 413 PAYLOAD_TOO_LARGE, JSON and form alike', async (t) => {
  const { as } = await setup(t)
  const alice = await as('alice')
  const big = 'x'.repeat(1024 * 1024 + 1)
  for (const format of ['json', 'form'] as const) {
    const res = await alice.post('/v2/probe/echo', { name: big }, { format })
    t.equal(res.statusCode, 413, format)
    t.match(res.json(), { statusCode: 413, error: 'Payload Too Large', code: 'PAYLOAD_TOO_LARGE', message: /1048576 bytes/ })
  }
  const justUnder = await alice.post('/v2/probe/echo', { name: 'x'.repeat(1000 * 1000) })
  t.equal(justUnder.statusCode, 200)
})

t.test('every answer carries X-Request-Id; a client token is kept', async (t) => {
  const { app, as } = await setup(t)
  const alice = await as('alice')
  const ok = await alice.get('/v2/user/alice')
  t.match(ok.headers['x-request-id'], /^[0-9a-f-]{36}$/)
  const failed = await app.inject({ method: 'GET', url: '/v2/user/alice' })
  t.equal(failed.statusCode, 401)
  t.ok(failed.headers['x-request-id'])
  const notFound = await app.inject({ method: 'GET', url: '/nowhere' })
  t.ok(notFound.headers['x-request-id'])
  const traced = await alice.get('/v2/user/alice', { headers: { 'x-request-id': 'trace-123.abc' } })
  t.equal(traced.headers['x-request-id'], 'trace-123.abc')
  const hostile = await alice.get('/v2/user/alice', { headers: { 'x-request-id': 'bad id\twith spaces' } })
  t.not(hostile.headers['x-request-id'], 'bad id\twith spaces')
})

t.test('authentication is checked before the body is read or validated', async (t) => {
  const { app } = await setup(t)
  for (const [type, payload] of [['text/plain', 'x'], ['application/json', '{bad'], ['application/json', 'x'.repeat(2 * 1024 * 1024)]]) {
    const res = await app.inject({ method: 'POST', url: '/v2/probe/echo', headers: { 'content-type': type! }, payload: payload! })
    t.equal(res.statusCode, 401, `${type}: an unauthenticated caller learns nothing about body formats or limits`)
  }
})
