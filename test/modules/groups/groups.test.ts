import t from 'tap'
import { sql } from 'drizzle-orm'
import { queryRows } from '../../../src/db/rows.js'
import { build, type Caller } from '../../helper.js'

const GROUP_ID = /^grp_[0-9a-z]{26}$/

async function types (caller: Caller): Promise<string[]> {
  const res = await caller.get('/v2/events?limit=1000')
  return res.json().events.map((e: { type: string }) => e.type)
}

t.test('POST /v2/group creates a group with the caller as owner and member, in JSON and form', async (t) => {
  const { as } = await build(t)
  const alice = await as('alice')
  const bob = await as('bob')
  await as('carol')
  const json = await alice.post('/v2/group', { name: 'ops', members: ['Bob', 'carol'] })
  t.equal(json.statusCode, 200)
  t.match(json.json(), { id: GROUP_ID, name: 'ops', owner: 'alice', members: ['alice', 'bob', 'carol'], createdAt: /Z$/, updatedAt: /Z$/ })
  const form = await alice.post('/v2/group', { name: 'solo-ish', members: 'bob' }, { format: 'form' })
  t.match(form.json(), { owner: 'alice', members: ['alice', 'bob'] })
  const alone = await bob.post('/v2/group', { name: 'just me' })
  t.same(alone.json().members, ['bob'])
  const events = (await bob.get('/v2/events')).json().events
  t.match(events[0], { type: 'group.created', data: { group: { id: json.json().id, name: 'ops' } } })

  t.match((await alice.post('/v2/group', { name: 'x', members: ['nobody'] })).json(), { statusCode: 404, message: 'user nobody not found' })
  t.match((await alice.post('/v2/group', { name: '' })).json(), { statusCode: 400, message: /name/ })
  t.match((await alice.post('/v2/group', { name: 'y'.repeat(101) })).json(), { statusCode: 400, message: /name/ })
  t.match((await alice.post('/v2/group', { members: ['bob'] })).json(), { statusCode: 400, message: /name/ })
})

t.test('GET /v2/group/:id is for members; rename and delete are for the owner', async (t) => {
  const { as } = await build(t)
  const alice = await as('alice')
  const bob = await as('bob')
  const carol = await as('carol')
  const group = (await alice.post('/v2/group', { name: 'ops', members: ['bob'] })).json()
  t.equal((await bob.get(`/v2/group/${group.id}`)).statusCode, 200)
  t.match((await carol.get(`/v2/group/${group.id}`)).json(), { statusCode: 403, code: 'FORBIDDEN', message: new RegExp(group.id) })
  t.match((await alice.get('/v2/group/grp_00000000000000000000000000')).json(), { statusCode: 404, message: 'group grp_00000000000000000000000000 not found' })
  t.equal((await alice.get('/v2/group/nope')).statusCode, 400)

  t.equal((await bob.post(`/v2/group/${group.id}`, { name: 'mine now' })).statusCode, 403)
  const renamed = await alice.post(`/v2/group/${group.id}`, { name: 'operations' }, { format: 'form' })
  t.equal(renamed.statusCode, 200)
  t.match(renamed.json(), { name: 'operations' })
  t.ok(renamed.json().updatedAt >= group.updatedAt)
  t.match(await types(bob), ['group.created', 'group.updated'])

  t.equal((await bob.delete(`/v2/group/${group.id}`)).statusCode, 403)
  t.equal((await alice.delete(`/v2/group/${group.id}`)).statusCode, 204)
  t.equal((await alice.get(`/v2/group/${group.id}`)).statusCode, 404)
  const last = (await bob.get('/v2/events')).json().events.at(-1)
  t.match(last, { type: 'group.deleted', data: { group: group.id } })
})

t.test('members: the owner adds and removes; a member may only leave; events reach removed members too', async (t) => {
  const { as } = await build(t)
  const alice = await as('alice')
  const bob = await as('bob')
  const carol = await as('carol')
  await as('dave')
  const group = (await alice.post('/v2/group', { name: 'ops', members: ['bob'] })).json()

  t.equal((await bob.post(`/v2/group/${group.id}/members`, { members: ['carol'] })).statusCode, 403, 'only the owner adds')
  t.match((await alice.post(`/v2/group/${group.id}/members`, { members: ['ghost'] })).json(), { statusCode: 404, message: 'user ghost not found' })
  const added = await alice.post(`/v2/group/${group.id}/members`, { members: ['carol', 'dave'] }, { format: 'form' })
  t.same(added.json().members, ['alice', 'bob', 'carol', 'dave'])
  t.match((await carol.get('/v2/events')).json().events, [{ type: 'group.members_added', data: { group: group.id, members: ['carol', 'dave'] } }])

  t.equal((await bob.post(`/v2/group/${group.id}/members/remove`, { members: ['carol'] })).statusCode, 403, 'a member removes only itself')
  const ownerLeaves = await alice.post(`/v2/group/${group.id}/members/remove`, { members: ['alice'] })
  t.match(ownerLeaves.json(), { statusCode: 400, message: /owner cannot leave/ })
  t.match((await alice.post(`/v2/group/${group.id}/members/remove`, { members: ['zed'] })).json(), { statusCode: 404 })

  const removed = await alice.post(`/v2/group/${group.id}/members/remove`, { members: ['carol'] })
  t.same(removed.json().members, ['alice', 'bob', 'dave'])
  t.match((await carol.get('/v2/events')).json().events.at(-1), { type: 'group.members_removed', data: { group: group.id, members: ['carol'] } }, 'the removed member is told')
  t.equal((await carol.get(`/v2/group/${group.id}`)).statusCode, 403)

  const left = await bob.post(`/v2/group/${group.id}/members/remove`, { members: 'bob' }, { format: 'form' })
  t.equal(left.statusCode, 200)
  t.same(left.json().members, ['alice', 'dave'])
})

t.test('a group message goes to every member but the sender, each with a delivery row and an event', async (t) => {
  const { as, db } = await build(t)
  const alice = await as('alice')
  const bob = await as('bob')
  const carol = await as('carol')
  const dave = await as('dave')
  const group = (await alice.post('/v2/group', { name: 'ops', members: ['bob', 'carol'] })).json()
  const sent = await bob.post('/v2/message', { recipient: group.id, body: 'standup?' })
  t.equal(sent.statusCode, 200)
  t.match(sent.json(), { sender: 'bob', recipient: group.id })
  const deliveries = await queryRows<{ recipient: string }>(db, sql`SELECT recipient FROM deliveries WHERE message_id = ${sent.json().id} ORDER BY recipient`)
  t.same(deliveries.map((d) => d.recipient), ['alice', 'carol'])
  for (const member of [alice, carol]) {
    t.equal((await member.get(`/v2/message/${sent.json().id}`)).statusCode, 200)
    t.ok((await types(member)).includes('message.received'))
  }
  t.notOk((await types(bob)).includes('message.received'), 'not to the sender')
  t.equal(sent.headers['x-quota-remaining'], '99', 'a group message counts once')

  const outsider = await dave.post('/v2/message', { recipient: group.id, body: 'let me in' })
  t.match(outsider.json(), { statusCode: 403, code: 'FORBIDDEN' })
  t.equal((await dave.get(`/v2/message/${sent.json().id}`)).statusCode, 403)

  await alice.post(`/v2/group/${group.id}/members`, { members: ['dave'] })
  t.equal((await dave.get(`/v2/message/${sent.json().id}`)).statusCode, 403, 'recipients are the members at send time')
})
