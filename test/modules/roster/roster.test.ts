import t from 'tap'
import { build } from '../../helper.js'

t.test('roster: add users and groups, rename by adding again, list, remove', async (t) => {
  const { as } = await build(t)
  const alice = await as('alice')
  const bob = await as('bob')
  await as('carol')
  const group = (await bob.post('/v2/group', { name: 'g', members: ['alice'] })).json()

  t.same((await alice.get('/v2/roster')).json(), { entries: [] })
  const added = await alice.post('/v2/roster', { entity: 'Bob', name: 'Bobby' })
  t.equal(added.statusCode, 200)
  t.match(added.json(), { entity: 'bob', type: 'user', name: 'Bobby', addedAt: /Z$/ })
  t.match((await alice.post('/v2/roster', { entity: group.id }, { format: 'form' })).json(), { entity: group.id, type: 'group', name: null })
  t.match((await alice.post('/v2/roster', { entity: 'carol' }, { format: 'form' })).json(), { entity: 'carol', name: null })
  const renamed = await alice.post('/v2/roster', { entity: 'bob', name: 'Robert' })
  t.match(renamed.json(), { entity: 'bob', name: 'Robert', addedAt: added.json().addedAt })
  t.match((await alice.post('/v2/roster', { entity: 'bob' })).json(), { name: 'Robert' }, 'adding again without a name keeps it')
  const list = (await alice.get('/v2/roster')).json().entries
  t.same(list.map((e: { entity: string }) => e.entity), ['bob', group.id, 'carol'])
  t.same((await bob.get('/v2/roster')).json().entries, [], 'each caller has its own roster')

  t.equal((await alice.delete('/v2/roster/carol')).statusCode, 204)
  t.match((await alice.delete('/v2/roster/carol')).json(), { statusCode: 404, message: 'roster entry carol not found' })
  t.same((await alice.get('/v2/roster')).json().entries.map((e: { entity: string }) => e.entity), ['bob', group.id])
})

t.test('roster: unknown entities 404, groups the caller cannot see 403, messages 400', async (t) => {
  const { as } = await build(t)
  const alice = await as('alice')
  const bob = await as('bob')
  const secret = (await bob.post('/v2/group', { name: 'private' })).json()
  t.match((await alice.post('/v2/roster', { entity: 'nobody' })).json(), { statusCode: 404, message: 'user nobody not found' })
  t.match((await alice.post('/v2/roster', { entity: secret.id })).json(), { statusCode: 403, code: 'FORBIDDEN' })
  t.match((await alice.post('/v2/roster', { entity: 'grp_00000000000000000000000000' })).json(), { statusCode: 404 })
  const message = (await bob.post('/v2/message', { recipient: 'alice', body: 'x' })).json()
  t.match((await alice.post('/v2/roster', { entity: message.id })).json(), { statusCode: 400, message: /entity/ })
  t.match((await alice.post('/v2/roster', { entity: 'bad entity!' })).json(), { statusCode: 400, message: /entity/ })
  t.match((await alice.post('/v2/roster', { name: 'x' })).json(), { statusCode: 400, message: /entity/ })
})
