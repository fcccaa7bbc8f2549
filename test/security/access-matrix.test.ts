import t from 'tap'
import { createKeysRepository } from '../../src/modules/keys/keys.repository.js'
import { basic, build, type Caller } from '../helper.js'

type Role = 'none' | 'revoked' | 'stranger' | 'member' | 'owner'
const ROLES: Role[] = ['none', 'revoked', 'stranger', 'member', 'owner']
const SECRET_BODY = 'the eagle lands at dawn'
const GROUP_NAME = 'covert-ops'

interface Fixture { group: string, message: string }

interface Row {
  route: string
  call: (as: Caller, f: Fixture) => ReturnType<Caller['get']>
  /** Statuses for stranger, member (group member, message recipient), owner (group owner, sender). */
  expect: [number, number, number]
}

const rows: Row[] = [
  { route: 'GET /events', call: (c) => c.get('/v2/events'), expect: [200, 200, 200] },
  { route: 'POST /events/ack', call: (c) => c.post('/v2/events/ack', { upTo: '1' }), expect: [204, 204, 204] },
  { route: 'DELETE /events', call: (c) => c.delete('/v2/events?upTo=1'), expect: [204, 204, 204] },
  { route: 'GET /user/{user}', call: (c) => c.get('/v2/user/alice'), expect: [200, 200, 200] },
  { route: 'GET /whoami', call: (c) => c.get('/v2/whoami'), expect: [200, 200, 200] },
  { route: 'POST /group', call: (c) => c.post('/v2/group', { name: 'new' }), expect: [200, 200, 200] },
  { route: 'GET /group/{group}', call: (c, f) => c.get(`/v2/group/${f.group}`), expect: [403, 200, 200] },
  { route: 'POST /group/{group}', call: (c, f) => c.post(`/v2/group/${f.group}`, { name: 'renamed' }), expect: [403, 403, 200] },
  { route: 'DELETE /group/{group}', call: (c, f) => c.delete(`/v2/group/${f.group}`), expect: [403, 403, 204] },
  { route: 'POST /group/{group}/members', call: (c, f) => c.post(`/v2/group/${f.group}/members`, { members: ['frank'] }), expect: [403, 403, 200] },
  { route: 'POST /group/{group}/members/remove', call: (c, f) => c.post(`/v2/group/${f.group}/members/remove`, { members: ['bob'] }), expect: [403, 200, 200] },
  { route: 'POST /message', call: (c, f) => c.post('/v2/message', { recipient: f.group, body: 'hi' }), expect: [403, 200, 200] },
  { route: 'GET /message/{message}', call: (c, f) => c.get(`/v2/message/${f.message}`), expect: [403, 200, 200] },
  { route: 'PATCH /message/{message}', call: (c, f) => c.patch(`/v2/message/${f.message}`, { body: 'edited' }), expect: [403, 403, 200] },
  { route: 'PUT /message/{message}/reactions/{emoji}', call: (c, f) => c.put(`/v2/message/${f.message}/reactions/%F0%9F%91%8D`), expect: [403, 204, 204] },
  { route: 'DELETE /message/{message}/reactions/{emoji}', call: (c, f) => c.delete(`/v2/message/${f.message}/reactions/%F0%9F%91%8D`), expect: [403, 204, 204] },
  { route: 'DELETE /message/{message}', call: (c, f) => c.delete(`/v2/message/${f.message}`), expect: [403, 204, 204] },
  { route: 'GET /message/{message}/attachment/1', call: (c, f) => c.get(`/v2/message/${f.message}/attachment/1`), expect: [403, 200, 200] },
  { route: 'GET /message/{message}/status', call: (c, f) => c.get(`/v2/message/${f.message}/status`), expect: [403, 200, 200] },
  { route: 'POST /message/status', call: (c, f) => c.post('/v2/message/status', { message: f.message, status: 'read' }), expect: [403, 204, 403] },
  { route: 'POST /message/typing', call: (c, f) => c.post('/v2/message/typing', { recipient: f.group }), expect: [403, 204, 204] },
  { route: 'DELETE /message/typing/{recipient}', call: (c, f) => c.delete(`/v2/message/typing/${f.group}`), expect: [403, 204, 204] },
  { route: 'GET /metadata/{group}', call: (c, f) => c.get(`/v2/metadata/${f.group}`), expect: [403, 200, 200] },
  { route: 'POST /metadata/{group}', call: (c, f) => c.post(`/v2/metadata/${f.group}`, { k: 'v' }), expect: [403, 403, 200] },
  { route: 'GET /metadata/{message}', call: (c, f) => c.get(`/v2/metadata/${f.message}`), expect: [403, 200, 200] },
  { route: 'POST /metadata/{message}', call: (c, f) => c.post(`/v2/metadata/${f.message}`, { k: 'v' }), expect: [403, 403, 200] },
  { route: 'GET /roster', call: (c) => c.get('/v2/roster'), expect: [200, 200, 200] },
  { route: 'POST /roster', call: (c, f) => c.post('/v2/roster', { entity: f.group }), expect: [403, 200, 200] },
  { route: 'DELETE /roster/{entity}', call: (c, f) => c.delete(`/v2/roster/${f.group}`), expect: [404, 404, 404] },
  { route: 'POST /search', call: (c) => c.post('/v2/search', { query: 'eagle' }), expect: [200, 200, 200] },
  { route: 'GET /conversations', call: (c) => c.get('/v2/conversations'), expect: [200, 200, 200] },
  { route: 'GET /conversations/{group}/messages', call: (c, f) => c.get(`/v2/conversations/${f.group}/messages`), expect: [403, 200, 200] },
  { route: 'POST /conversations/{group}/read', call: (c, f) => c.post(`/v2/conversations/${f.group}/read`, { upTo: f.message }), expect: [403, 204, 204] }
]

t.test('every /v2 route answers each kind of caller as API.md says, and leaks nothing to strangers', async (t) => {
  const { app, as, createKey, createUser, db } = await build(t, { env: { RATE_LIMIT_PER_SECOND: '100000' } })
  // A fixture per cell: more sends than the default daily quota.
  const alice = await as('alice', { dailyQuota: 100_000 })
  const bob = await as('bob')
  const carol = await as('carol')
  await createUser('frank')
  await createUser('eve')
  const revokedKey = await createKey('eve')
  await createKeysRepository(db).revoke(revokedKey.keyId)
  const revoked = { ...carol, authorization: basic(revokedKey.keyId, revokedKey.secret) }

  async function fixture (): Promise<Fixture> {
    const group = (await alice.post('/v2/group', { name: GROUP_NAME, members: ['bob'] })).json().id as string
    const form = new FormData()
    form.append('recipient', group)
    form.append('body', SECRET_BODY)
    form.append('attachment', new Blob([new Uint8Array(Buffer.from('classified'))], { type: 'text/plain' }), 'plan.txt')
    const message = (await alice.post('/v2/message', form)).json().id as string
    return { group, message }
  }

  const callers: Record<Role, Caller> = {
    none: { ...carol, authorization: '' },
    revoked,
    stranger: carol,
    member: bob,
    owner: alice
  }
  for (const row of rows) {
    for (const role of ROLES) {
      const f = await fixture()
      const caller = callers[role]
      // Callers share the helper's inject wrapper; swap in this role's Authorization header.
      const withAuth: Caller = {
        ...caller,
        get: (url) => app.inject({ method: 'GET', url, headers: role === 'none' ? {} : { authorization: caller.authorization } }),
        delete: (url) => app.inject({ method: 'DELETE', url, headers: role === 'none' ? {} : { authorization: caller.authorization } }),
        put: (url) => app.inject({ method: 'PUT', url, headers: role === 'none' ? {} : { authorization: caller.authorization } }),
        patch: (url, body) => app.inject({ method: 'PATCH', url, headers: { 'content-type': 'application/json', ...(role === 'none' ? {} : { authorization: caller.authorization }) }, payload: JSON.stringify(body ?? {}) }),
        post: (url, body) => body instanceof FormData
          ? caller.post(url, body)
          : app.inject({ method: 'POST', url, headers: { 'content-type': 'application/json', ...(role === 'none' ? {} : { authorization: caller.authorization }) }, payload: JSON.stringify(body ?? {}) })
      }
      const res = await row.call(withAuth, f)
      const want = role === 'none' || role === 'revoked' ? 401 : row.expect[ROLES.indexOf(role) - 2]!
      t.equal(res.statusCode, want, `${row.route} as ${role}`)
      if (res.statusCode >= 400) t.match(res.json(), { statusCode: want, code: String, message: String }, `${row.route} as ${role}: error body`)
      if (role === 'stranger' || role === 'none' || role === 'revoked') {
        t.notOk(res.body.includes(SECRET_BODY) || res.body.includes(GROUP_NAME) || res.body.includes('classified'), `${row.route} as ${role}: nothing leaks`)
      }
    }
  }
})
