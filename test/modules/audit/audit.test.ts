import { sql } from 'drizzle-orm'
import t from 'tap'
import { AUDIT_ACTIONS } from '../../../src/modules/audit/audit.schemas.js'
import { runCliInProcess } from '../../support/processes.js'
import { actorOf, setUp, shape, type Entry } from './support.js'

const requestId = (res: { headers: Record<string, unknown> }) => String(res.headers['x-request-id'])

t.test('every admin action and key change through the API writes one entry: actor, action, target, request id and ip', async (t) => {
  const { admin, audit, callerFor } = await setUp(t)
  const expected: ReturnType<typeof shape>[] = []
  const secrets: string[] = [admin.secret]
  const by = actorOf(admin)
  async function step (res: Promise<{ statusCode: number, body: string, headers: Record<string, unknown> }>, action: string, target: (body: string) => string, actor = by) {
    const answer = await res
    t.ok([200, 202, 204].includes(answer.statusCode), `${action}: ${answer.body}`)
    expected.push({ actor, action, target: target(answer.body), requestId: requestId(answer) })
    return answer.body === '' ? {} : JSON.parse(answer.body) as Record<string, string>
  }

  await step(admin.post('/v2/admin/users', { address: 'Dana' }), 'user.create', () => 'dana')
  await step(admin.post('/v2/admin/users/dana', { displayName: 'Dana Scully' }), 'user.update', () => 'dana')
  await step(admin.post('/v2/admin/users/dana', { deactivated: true }), 'user.deactivate', () => 'dana')
  await step(admin.post('/v2/admin/users/dana', { deactivated: false }), 'user.reactivate', () => 'dana')
  const key = await step(admin.post('/v2/admin/keys', { address: 'dana' }), 'key.create', (body) => JSON.parse(body).keyId)
  secrets.push(key.secret!)
  await step(admin.post(`/v2/admin/keys/${key.keyId}`, { dailyQuota: 5, scopes: ['read', 'send'] }), 'key.update', () => key.keyId!)

  // The user's own key registers and deletes webhooks: the entries name that key.
  const dana = callerFor('dana', { keyId: key.keyId!, secret: key.secret! })
  const hook = await step(dana.post('/v2/webhooks', { url: 'http://127.0.0.1:9/one' }), 'webhook.create', (body) => JSON.parse(body).id, actorOf(dana))
  secrets.push(hook.secret!)
  await step(dana.delete(`/v2/webhooks/${hook.id}`), 'webhook.delete', () => hook.id!, actorOf(dana))
  const other = await step(dana.post('/v2/webhooks', { url: 'http://127.0.0.1:9/two' }), 'webhook.create', (body) => JSON.parse(body).id, actorOf(dana))
  secrets.push(other.secret!)
  await step(admin.delete(`/v2/admin/users/dana/webhooks/${other.id}`), 'webhook.delete', () => other.id!)
  await step(admin.delete(`/v2/admin/keys/${key.keyId}`), 'key.revoke', () => key.keyId!)
  // An export is a read, but of everything: recorded (its answer is a zip, not JSON).
  const exported = await admin.get('/v2/admin/users/dana/export')
  t.equal(exported.statusCode, 200, 'user.export')
  expected.push({ actor: by, action: 'user.export', target: 'dana', requestId: requestId(exported) })
  await step(admin.delete('/v2/admin/users/dana'), 'user.erase', () => 'dana')

  // Reads write nothing.
  t.equal((await admin.get('/v2/admin/users')).statusCode, 200)
  t.equal((await admin.get('/v2/admin/keys')).statusCode, 200)

  const entries = await audit()
  t.same(entries.map(shape), [...expected].reverse(), 'one entry per action, newest first, each with its request\'s X-Request-Id')
  t.ok(entries.every((e) => e.ip === '127.0.0.1'), 'the client\'s address')
  t.ok(entries.every((e) => /^[0-9]+$/.test(e.id) && !Number.isNaN(Date.parse(e.at))), 'ids and times')
  t.same([...new Set(entries.map((e) => e.action))].sort(), [...AUDIT_ACTIONS].sort(), 'every action the log knows (AUDIT_ACTIONS), each written by this walk')
  const text = JSON.stringify(entries)
  for (const secret of secrets) t.notOk(text.includes(secret), 'no secret in any entry')

  // A client's own X-Request-Id is the one recorded.
  const named = await admin.post('/v2/admin/users', { address: 'erin' }, { headers: { 'x-request-id': 'ticket-4711' } })
  t.equal(named.headers['x-request-id'], 'ticket-4711')
  t.match((await audit())[0], { action: 'user.create', target: 'erin', requestId: 'ticket-4711' })
})

t.test('the CLI\'s user and key commands write entries with actor cli and no request; parley audit prints them', async (t) => {
  const { database, audit } = await setUp(t)
  const cli = (...args: string[]) => runCliInProcess(args, {}, database)
  t.equal((await cli('user', 'create', 'erin', '--name', 'Erin')).code, 0)
  t.equal((await cli('user', 'deactivate', 'erin')).code, 0)
  t.equal((await cli('user', 'reactivate', 'erin')).code, 0)
  const created = await cli('key', 'create', 'erin', '--json')
  t.equal(created.code, 0, created.stderr)
  const { keyId, secret } = JSON.parse(created.stdout) as { keyId: string, secret: string }
  t.equal((await cli('key', 'quota', keyId, '7')).code, 0)
  t.equal((await cli('key', 'revoke', keyId)).code, 0)
  t.equal((await cli('user', 'erase', 'erin')).code, 0)

  const expected = [
    ['user.create', 'erin'], ['user.deactivate', 'erin'], ['user.reactivate', 'erin'],
    ['key.create', keyId], ['key.update', keyId], ['key.revoke', keyId], ['user.erase', 'erin']
  ].reverse()
  const entries = await audit()
  t.same(entries.map((e) => [e.action, e.target]), expected, 'the API shows each, newest first')
  t.ok(entries.every((e) => e.actor === 'cli' && e.requestId === null && e.ip === null), 'actor cli, no request id, no ip')
  t.notOk(JSON.stringify(entries).includes(secret), 'never the secret')

  const json = await cli('audit', '--json')
  t.equal(json.code, 0, json.stderr)
  t.same(JSON.parse(json.stdout), entries, 'parley audit --json: the same entries as the API')
  const text = await cli('audit', '--limit', '2')
  t.equal(text.code, 0)
  const lines = text.stdout.trim().split('\n')
  t.match(lines[0], /^ID\s+AT\s+ACTOR\s+ACTION\s+TARGET\s+REQUEST\s+IP$/)
  t.equal(lines.length, 3, 'a header and --limit rows')
  t.match(lines[1], /cli\s+user\.erase\s+erin/)
  const filtered = JSON.parse((await cli('audit', '--action', 'key.create', '--actor', 'cli', '--target', keyId.toUpperCase(), '--json')).stdout) as Entry[]
  t.same(filtered.map((e) => e.action), ['key.create'], 'filters, case-insensitive')
  t.equal((await cli('audit', '--actor', 'erin')).stdout.trim(), 'No entries.', 'erin did nothing herself')

  for (const [args, reason] of [
    [['audit', '--action', 'user.delete'], /--action must be one of user\.create/],
    [['audit', '--limit', '0'], /--limit must be a whole number from 1 to 200/],
    [['audit', '--limit', '201'], /--limit/],
    [['audit', '--actor', 'no spaces'], /address/],
    [['audit', 'extra'], /takes no arguments/],
    [['user', 'list', '--action', 'key.create'], /takes no --action/]
  ] as const) {
    const res = await cli(...args)
    t.equal(res.code, 2, args.join(' '))
    t.match(res.stderr, reason)
  }
  t.match((await cli('audit', '--help')).stdout, /Usage: parley audit \[--limit N\] \[--actor X\] \[--action A\] \[--target T\]/)
  t.match((await cli('--help')).stdout, /audit \[--limit N\]/)
})

t.test('an action that fails writes no entry, and an entry that cannot be written undoes its action', async (t) => {
  const { admin, audit, callerFor, createUser, createKey, db, database } = await setUp(t)
  await createUser('dana')
  const dana = callerFor('dana', await createKey('dana'))
  t.equal((await admin.post('/v2/admin/users', { address: 'bob' })).statusCode, 200)
  const before = await audit()
  t.equal(before.length, 1)

  const failures: [string, Promise<{ statusCode: number }>, number][] = [
    ['a user that exists', admin.post('/v2/admin/users', { address: 'BOB' }), 409],
    ['a key for no user', admin.post('/v2/admin/keys', { address: 'nobody' }), 404],
    ['an unknown user\'s update', admin.post('/v2/admin/users/nobody', { deactivated: true }), 404],
    ['an unknown user\'s erasure', admin.delete('/v2/admin/users/nobody'), 404],
    ['an unknown key\'s update', admin.post('/v2/admin/keys/key_00000000000000000000000000', { dailyQuota: 1 }), 404],
    ['an unknown key\'s revocation', admin.delete('/v2/admin/keys/key_00000000000000000000000000'), 404],
    ['an unknown webhook, by the admin', admin.delete('/v2/admin/users/dana/webhooks/whk_00000000000000000000000000'), 404],
    ['an unknown webhook, by its user', dana.delete('/v2/webhooks/whk_00000000000000000000000000'), 404],
    ['a bad body', admin.post('/v2/admin/keys', { address: 'dana', scopes: ['root'] }), 400]
  ]
  for (const [what, res, status] of failures) t.equal((await res).statusCode, status, what)
  for (let i = 0; i < 10; i++) t.equal((await dana.post('/v2/webhooks', { url: `http://127.0.0.1:9/${i}` })).statusCode, 200)
  t.equal((await dana.post('/v2/webhooks', { url: 'http://127.0.0.1:9/eleventh' })).statusCode, 409, 'the eleventh webhook: refused inside the transaction')
  for (const args of [['user', 'create', 'bob'], ['key', 'revoke', 'key_00000000000000000000000000'], ['key', 'quota', 'key_00000000000000000000000000', '3'], ['user', 'deactivate', 'nobody']]) {
    t.equal((await runCliInProcess(args, {}, database)).code, 1, `parley ${args.join(' ')} fails`)
  }
  const after = await audit()
  t.same(after.slice(10), before, 'no entry for any failure')
  t.same(after.slice(0, 10).map((e) => e.action), Array(10).fill('webhook.create'), 'only the ten webhooks that were made')

  // Entries refused by the database: the change they record is rolled back with them.
  await db.execute(sql`ALTER TABLE audit_log ADD CONSTRAINT audit_test_refuses CHECK (false) NOT VALID`)
  t.equal((await admin.post('/v2/admin/users', { address: 'carol' })).statusCode, 500)
  t.equal((await admin.get('/v2/admin/users/carol')).statusCode, 404, 'no user without its entry')
  t.equal((await admin.post('/v2/admin/keys', { address: 'dana' })).statusCode, 500)
  t.equal((await admin.get('/v2/admin/keys?address=dana')).json().keys.length, 1, 'no key without its entry')
  t.equal((await runCliInProcess(['user', 'create', 'carol'], {}, database)).code, 1)
  t.equal((await admin.get('/v2/admin/users/carol')).statusCode, 404, 'nor from the CLI')
  await db.execute(sql`ALTER TABLE audit_log DROP CONSTRAINT audit_test_refuses`)
  t.same(await audit(), after)
})

t.test('GET /v2/admin/audit is for admin keys, validates its query naming the field, and nothing changes or deletes an entry', async (t) => {
  const { admin, as, audit, app } = await setUp(t)
  t.equal((await admin.post('/v2/admin/users', { address: 'dana' })).statusCode, 200)
  const alice = await as('alice')
  t.match((await alice.get('/v2/admin/audit')).json(), { statusCode: 403, code: 'FORBIDDEN', message: /admin scope/ })
  t.equal((await app.inject({ method: 'GET', url: '/v2/admin/audit' })).statusCode, 401)

  const bad: [string, string][] = [
    ['limit=0', 'limit'], ['limit=201', 'limit'], ['limit=x', 'limit'], ['cursor=%25%25', 'cursor'], ['cursor=bm9wZQ', 'cursor'],
    ['action=user.delete', 'action'], ['actor=no%20spaces', 'actor'], ['actor=key_short', 'actor'], ['target=', 'target']
  ]
  for (const [query, field] of bad) {
    const res = await admin.get(`/v2/admin/audit?${query}`)
    t.equal(res.statusCode, 400, query)
    t.match(res.json(), { code: 'VALIDATION_FAILED', message: new RegExp(field) }, `${query} names ${field}`)
  }

  const [entry] = await audit()
  for (const method of ['DELETE', 'PATCH', 'PUT'] as const) {
    for (const url of ['/v2/admin/audit', `/v2/admin/audit/${entry!.id}`]) {
      const res = await app.inject({ method, url, headers: { authorization: admin.authorization, 'content-type': 'application/json' }, payload: '{}' })
      t.equal(res.statusCode, 404, `${method} ${url}`)
      t.match(res.json(), { code: 'NOT_FOUND' })
    }
  }
  t.same(await audit(), [entry], 'the entry is as it was')
})
