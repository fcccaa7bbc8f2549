import t from 'tap'
import { createKeysRepository } from '../../../src/modules/keys/keys.repository.js'
import { build } from '../../helper.js'

const ENV = { WEBHOOK_ALLOW_PRIVATE: 'true', RATE_LIMIT_PER_SECOND: '100000' }

async function setUp (t: Parameters<typeof build>[0]) {
  const built = await build(t, { env: ENV })
  const keys = createKeysRepository(built.db)
  await built.createUser('root')
  const admin = built.callerFor('root', await keys.create('root', null, { scopes: ['admin'] }))
  const bob = await built.as('bob')
  const carol = await built.as('carol')
  return { ...built, keys, admin, bob, carol }
}

t.test('GET /v2/admin/users/:user/webhooks pages a user\'s webhooks, naming the key that registered each', async (t) => {
  const { admin, bob, carol, keys, callerFor } = await setUp(t)
  const other = callerFor('bob', await keys.create('bob'))
  const made: string[] = []
  for (const [i, caller] of [bob, other, bob].entries()) {
    const res = await caller.post('/v2/webhooks', { url: `http://127.0.0.1:9/hook-${i}` })
    t.equal(res.statusCode, 200)
    made.push(res.json().id)
  }
  t.equal((await carol.post('/v2/webhooks', { url: 'http://127.0.0.1:9/carol' })).statusCode, 200)

  const first = await admin.get('/v2/admin/users/BOB/webhooks?limit=2')
  t.equal(first.statusCode, 200)
  const page = first.json()
  t.equal(page.webhooks.length, 2)
  t.type(page.nextCursor, 'string')
  const second = (await admin.get(`/v2/admin/users/bob/webhooks?limit=2&cursor=${page.nextCursor}`)).json()
  t.equal(second.nextCursor, null, 'the last page')
  const all = [...page.webhooks, ...second.webhooks]
  t.same(all.map((w: { id: string }) => w.id).sort(), [...made].sort(), 'bob\'s three, and not carol\'s')
  const byId = new Map(all.map((w: { id: string }) => [w.id, w]))
  t.match(byId.get(made[0]!), { address: 'bob', keyId: bob.keyId, url: 'http://127.0.0.1:9/hook-0', disabledAt: null })
  t.match(byId.get(made[1]!), { keyId: other.keyId })
  t.notOk(all.some((w: Record<string, unknown>) => 'secret' in w), 'never a secret')

  // Revoking a key disables the webhooks it registered, and only those.
  t.equal((await admin.delete(`/v2/admin/keys/${other.keyId}`)).statusCode, 204)
  const after = (await admin.get('/v2/admin/users/bob/webhooks?limit=10')).json().webhooks as { id: string, disabledAt: string | null }[]
  t.same(after.filter((w) => w.disabledAt !== null).map((w) => w.id), [made[1]], 'the revoked key\'s webhook is disabled')
  const seen = (await bob.get('/v2/webhooks')).json().webhooks as { id: string, disabledAt: string | null }[]
  t.ok(seen.find((w) => w.id === made[1])?.disabledAt, 'and its user sees it disabled too')
  const redeliver = await bob.post(`/v2/webhooks/${made[1]}/redeliver`, { event: '1' })
  t.equal(redeliver.statusCode, 409)
  t.match(redeliver.json().message, /revoked/)

  t.equal((await admin.get('/v2/admin/users/nobody/webhooks')).statusCode, 404, 'an unknown user: 404')
  t.match((await admin.get('/v2/admin/users/nobody/webhooks')).json(), { code: 'NOT_FOUND', message: 'user nobody not found' })
  t.equal((await admin.get('/v2/admin/users/bob/webhooks?cursor=nonsense')).statusCode, 400, 'a cursor that is not one: 400')
  t.equal((await admin.get('/v2/admin/users/bob/webhooks?limit=0')).statusCode, 400)
})

t.test('DELETE /v2/admin/users/:user/webhooks/:id removes it and its log; 404 for another user\'s or an unknown one', async (t) => {
  const { admin, bob, carol } = await setUp(t)
  const hook = (await bob.post('/v2/webhooks', { url: 'http://127.0.0.1:9/hook' })).json().id as string
  const carols = (await carol.post('/v2/webhooks', { url: 'http://127.0.0.1:9/carol' })).json().id as string

  const wrongUser = await admin.delete(`/v2/admin/users/bob/webhooks/${carols}`)
  t.equal(wrongUser.statusCode, 404, 'carol\'s webhook is not bob\'s')
  t.match(wrongUser.json(), { code: 'NOT_FOUND', message: `webhook ${carols} not found` })
  t.equal((await admin.delete(`/v2/admin/users/nobody/webhooks/${hook}`)).statusCode, 404, 'an unknown user')
  t.equal((await admin.delete('/v2/admin/users/bob/webhooks/not-a-webhook')).statusCode, 400, 'not a webhook id')

  t.equal((await admin.delete(`/v2/admin/users/bob/webhooks/${hook}`)).statusCode, 204)
  t.same((await bob.get('/v2/webhooks')).json().webhooks, [], 'bob no longer has it')
  t.equal((await bob.get(`/v2/webhooks/${hook}/deliveries`)).statusCode, 404, 'nor its log')
  t.equal((await admin.delete(`/v2/admin/users/bob/webhooks/${hook}`)).statusCode, 404, 'deleting it again: 404')
  t.equal((await carol.get('/v2/webhooks')).json().webhooks.length, 1, 'carol\'s is untouched')
})

t.test('the admin webhook routes need the admin scope: read and send keys get 403, the owner included', async (t) => {
  const { bob, keys, callerFor } = await setUp(t)
  const hook = (await bob.post('/v2/webhooks', { url: 'http://127.0.0.1:9/hook' })).json().id as string
  const everything = callerFor('bob', await keys.create('bob', null, { scopes: ['read', 'send'] }))
  for (const caller of [bob, everything]) {
    const list = await caller.get('/v2/admin/users/bob/webhooks')
    t.equal(list.statusCode, 403)
    t.match(list.json(), { code: 'FORBIDDEN', message: /admin scope/ })
    t.equal((await caller.delete(`/v2/admin/users/bob/webhooks/${hook}`)).statusCode, 403)
  }
  t.equal((await bob.get('/v2/webhooks')).json().webhooks.length, 1, 'still there')
})
