import { sql } from 'drizzle-orm'
import t from 'tap'
import { queryRows } from '../../../src/db/rows.js'
import { createKeysRepository } from '../../../src/modules/keys/keys.repository.js'
import { build } from '../../helper.js'

const ENV = { RATE_LIMIT_PER_SECOND: '100000' }

t.test('nothing is written to a deactivated user\'s feed: group changes, statuses, typing, deletes, sends; reactivated, it grows again', async (t) => {
  const { as, db, createUser, callerFor } = await build(t, { env: ENV })
  await createUser('root')
  const admin = callerFor('root', await createKeysRepository(db).create('root', null, { scopes: ['admin'] }))
  const alice = await as('alice')
  const bob = await as('bob')
  await as('carol')
  await as('dave')
  const group = (await alice.post('/v2/group', { name: 'ops', members: ['bob', 'carol'] })).json().id as string
  const fromBob = (await bob.post('/v2/message', { recipient: 'alice', body: 'from bob' })).json().id as string
  const toBob = (await alice.post('/v2/message', { recipient: 'bob', body: 'to bob' })).json().id as string
  // The newest id bob's feed has taken, and the events written after `after` (deleting a message
  // does remove bob's copy of it: a removal, not a write).
  const feed = async (after: number) => (await queryRows<{ n: number, seq: number }>(db, sql`
    SELECT (SELECT count(*)::int FROM events WHERE address = 'bob' AND seq > ${after}) AS n,
      (SELECT event_seq::int FROM users WHERE address = 'bob') AS seq`))[0]!
  const before = await feed(0)
  t.ok(before.n > 0)

  t.equal((await admin.post('/v2/admin/users/bob', { deactivated: true })).statusCode, 200)
  const writes: [string, Promise<{ statusCode: number }>][] = [
    ['rename', alice.post(`/v2/group/${group}`, { name: 'renamed' })],
    ['add a member', alice.post(`/v2/group/${group}/members`, { members: ['dave'] })],
    ['remove a member', alice.post(`/v2/group/${group}/members/remove`, { members: ['carol'] })],
    ['a group message', alice.post('/v2/message', { recipient: group, body: 'to the group' })],
    ['typing to the group', alice.post('/v2/message/typing', { recipient: group })],
    ['a status of bob\'s message', alice.post('/v2/message/status', { message: fromBob, status: 'read' })],
    ['deleting a message bob received', alice.delete(`/v2/message/${toBob}`)],
    ['a new group with bob', alice.post('/v2/group', { name: 'second', members: ['bob'] })]
  ]
  for (const [what, pending] of writes) {
    const res = await pending
    t.ok(res.statusCode >= 200 && res.statusCode < 300, `${what}: answered ${res.statusCode}`)
  }
  const direct = await alice.post('/v2/message', { recipient: 'bob', body: 'direct' })
  t.equal(direct.statusCode, 403, 'a message to bob answers 403, as before')
  t.same(await feed(before.seq), { n: 0, seq: before.seq }, 'bob\'s feed neither grew nor took ids')
  const carolsFeed = (await queryRows<{ n: number }>(db, sql`SELECT count(*)::int AS n FROM events WHERE address = 'carol' AND type = 'group.members_removed'`))[0]!
  t.equal(carolsFeed.n, 1, 'the other members\' feeds did (carol was told she was removed)')

  t.equal((await admin.post('/v2/admin/users/bob', { deactivated: false })).statusCode, 200)
  t.equal((await alice.post(`/v2/group/${group}`, { name: 'back' })).statusCode, 200)
  t.same(await feed(before.seq), { n: 1, seq: before.seq + 1 }, 'reactivated, bob\'s feed grows again: the rename, and nothing from before')
  const events = (await bob.get(`/v2/events?after=${before.seq}`)).json().events as { id: string, type: string }[]
  t.same(events.map((e) => [e.id, e.type]), [[String(before.seq + 1), 'group.updated']], 'with the next id: no gap to look like a skip')
})
