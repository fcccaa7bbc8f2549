import t from 'tap'
import { createKeysRepository } from '../../src/modules/keys/keys.repository.js'
import { createUsersRepository } from '../../src/modules/users/users.repository.js'
import { basic, build } from '../helper.js'

/** The scope each /v2 route needs (API.md §9), written out so a new route forces a decision here. */
const NEEDS: Record<string, 'read' | 'send' | 'admin'> = {
  'GET /v2/events': 'read',
  'GET /v2/events/stream': 'read',
  'POST /v2/events/ack': 'read',
  'DELETE /v2/events': 'read',
  'GET /v2/user/{user}': 'read',
  'GET /v2/whoami': 'read',
  'GET /v2/conversations': 'read',
  'GET /v2/conversations/{peer}/messages': 'read',
  'POST /v2/conversations/{peer}/read': 'send',
  'POST /v2/group': 'send',
  'GET /v2/group/{group}': 'read',
  'POST /v2/group/{group}': 'send',
  'DELETE /v2/group/{group}': 'send',
  'POST /v2/group/{group}/members': 'send',
  'POST /v2/group/{group}/members/remove': 'send',
  'POST /v2/message': 'send',
  'GET /v2/message/{message}': 'read',
  'PATCH /v2/message/{message}': 'send',
  'PUT /v2/message/{message}/reactions/{emoji}': 'send',
  'DELETE /v2/message/{message}/reactions/{emoji}': 'send',
  'DELETE /v2/message/{message}': 'send',
  'GET /v2/message/{message}/attachment/{n}': 'read',
  'GET /v2/message/{message}/status': 'read',
  'POST /v2/message/status': 'send',
  'POST /v2/message/typing': 'send',
  'DELETE /v2/message/typing/{recipient}': 'send',
  'GET /v2/metadata/{entity}': 'read',
  'POST /v2/metadata/{entity}': 'send',
  'GET /v2/roster': 'read',
  'POST /v2/roster': 'send',
  'DELETE /v2/roster/{entity}': 'send',
  'POST /v2/search': 'read',
  'POST /v2/webhooks': 'read',
  'GET /v2/webhooks': 'read',
  'DELETE /v2/webhooks/{id}': 'read',
  'GET /v2/webhooks/{id}/deliveries': 'read',
  'POST /v2/webhooks/{id}/redeliver': 'read',
  'POST /v2/admin/users': 'admin',
  'GET /v2/admin/users': 'admin',
  'GET /v2/admin/users/{user}': 'admin',
  'POST /v2/admin/users/{user}': 'admin',
  'DELETE /v2/admin/users/{user}': 'admin',
  'GET /v2/admin/users/{user}/webhooks': 'admin',
  'DELETE /v2/admin/users/{user}/webhooks/{id}': 'admin',
  'POST /v2/admin/keys': 'admin',
  'GET /v2/admin/keys': 'admin',
  'POST /v2/admin/keys/{keyId}': 'admin',
  'DELETE /v2/admin/keys/{keyId}': 'admin',
  'GET /v2/admin/audit': 'admin',
  'GET /v2/export': 'read',
  'GET /v2/admin/users/{user}/export': 'admin'
}

type Kind = 'read' | 'send' | 'admin' | 'expired' | 'deactivated'
const KINDS: Kind[] = ['read', 'send', 'admin', 'expired', 'deactivated']

t.test('every /v2 route × {read, send, admin, expired key, deactivated user}', async (t) => {
  const { app, as, db } = await build(t, { env: { RATE_LIMIT_PER_SECOND: '100000' } })
  const alice = await as('alice')
  await as('bob')
  const group = (await alice.post('/v2/group', { name: 'ops', members: ['bob'] })).json().id as string
  const message = (await alice.post('/v2/message', { recipient: 'bob', body: 'hi' })).json().id as string
  const keys = createKeysRepository(db)
  const credentials = {} as Record<Kind, string>
  for (const scope of ['read', 'send', 'admin'] as const) {
    const key = await keys.create('alice', null, { scopes: [scope] })
    credentials[scope] = basic(key.keyId, key.secret)
  }
  const expiredKey = await keys.create('alice', null, { scopes: ['read', 'send', 'admin'], expiresAt: new Date(Date.now() - 1_000) })
  credentials.expired = basic(expiredKey.keyId, expiredKey.secret)
  await as('dave')
  const dave = await keys.create('dave', null, { scopes: ['read', 'send', 'admin'] })
  credentials.deactivated = basic(dave.keyId, dave.secret)
  await createUsersRepository(db).update('dave', { deactivated: true })

  const spec = app.swagger() as { paths: Record<string, Record<string, unknown>> }
  const routes = Object.entries(spec.paths).flatMap(([path, methods]) =>
    Object.keys(methods).map((method) => `${method.toUpperCase()} ${path}`)).filter((r) => r.includes(' /v2/'))
  t.same(routes.filter((r) => NEEDS[r] === undefined), [], 'every route documented in OpenAPI has its scope in this table')

  const values: Record<string, string> = { user: 'bob', peer: 'bob', emoji: '%F0%9F%91%8D', group, message, n: '1', recipient: 'bob', entity: 'bob', keyId: expiredKey.keyId, id: `whk_${'0'.repeat(26)}` }
  for (const route of routes.filter((r) => NEEDS[r] !== undefined)) {
    const [method, template] = route.split(' ') as ['GET' | 'POST' | 'PUT' | 'PATCH' | 'DELETE', string]
    const url = template.replace(/\{(\w+)\}/g, (_, name: string) => values[name]!)
    for (const kind of KINDS) {
      const res = await app.inject({
        method,
        url,
        headers: {
          authorization: credentials[kind],
          ...(method === 'POST' || method === 'PATCH' ? { 'content-type': 'application/json' } : {}),
          // A bad Last-Event-ID answers 400 where the scope allows it, instead of streaming for ever.
          ...(route === 'GET /v2/events/stream' ? { 'last-event-id': 'not-an-id' } : {})
        },
        ...(method === 'POST' || method === 'PATCH' ? { payload: '{}' } : {})
      })
      const label = `${route} with a ${kind} key`
      if (kind === 'expired' || kind === 'deactivated') {
        t.equal(res.statusCode, 401, label)
      } else if (NEEDS[route] === kind) {
        t.not(res.statusCode, 401, label)
        t.notOk(res.statusCode === 403 && /scope/.test(res.body), `${label}: allowed (${res.statusCode})`)
      } else {
        t.equal(res.statusCode, 403, label)
        t.equal(res.json().message, `This API key lacks the ${NEEDS[route]} scope, which ${method} ${template.replace(/\{(\w+)\}/g, ':$1')} needs`, label)
      }
    }
  }
})
