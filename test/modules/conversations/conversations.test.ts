import t from 'tap'
import { build } from '../../helper.js'

interface Conversation { peer: string, type: string, unread: number, lastMessage: { id: string, body: string } }

// Between sends whose order the list shows: a conversation's time (in its cursor too) is the
// database's clock to the millisecond, and two sends in one millisecond would tie. That clock
// is not one a test can move, and there is no state to wait for: the wait is the point.
const pause = () => new Promise((resolve) => setTimeout(resolve, 5))

t.test('GET /v2/conversations lists 1:1 peers and groups, newest first, with the last message and unread counts', async (t) => {
  const { as } = await build(t)
  const alice = await as('alice')
  const bob = await as('bob')
  const carol = await as('carol')
  const send = async (from: typeof alice, recipient: string, body: string) => {
    const res = await from.post('/v2/message', { recipient, body })
    t.equal(res.statusCode, 200, res.body)
    await pause()
    return res.json().id as string
  }
  const group = (await alice.post('/v2/group', { name: 'ops', members: ['bob', 'carol'] })).json().id as string
  await send(bob, 'alice', 'hi alice')
  await send(alice, 'bob', 'hi bob')
  const fromCarol = await send(carol, 'alice', 'one from carol')
  await send(carol, 'alice', 'two from carol')
  await send(bob, group, 'to the group')
  const mine = await send(alice, group, 'alice to the group')

  const res = await alice.get('/v2/conversations')
  t.equal(res.statusCode, 200)
  const list = res.json().conversations as Conversation[]
  t.same(list.map((c) => [c.peer, c.type, c.lastMessage.body, c.unread]), [
    [group, 'group', 'alice to the group', 1],
    ['carol', 'user', 'two from carol', 2],
    ['bob', 'user', 'hi bob', 1]
  ])
  t.equal(list[0]!.lastMessage.id, mine)
  t.equal(res.json().nextCursor, null)

  // Reading carol's first message leaves one unread; her second, none.
  t.equal((await alice.post('/v2/message/status', { message: fromCarol, status: 'read' })).statusCode, 204)
  t.equal((await alice.get('/v2/conversations')).json().conversations[1].unread, 1)

  // Bob's view: the group, alice; carol never wrote to him.
  t.same((await bob.get('/v2/conversations')).json().conversations.map((c: Conversation) => [c.peer, c.unread]), [[group, 1], ['alice', 1]])
})

t.test('GET /v2/conversations leaves out hidden messages and groups the caller left, and pages with a cursor', async (t) => {
  const { as } = await build(t)
  const alice = await as('alice')
  const bob = await as('bob')
  const group = (await bob.post('/v2/group', { name: 'ops', members: ['alice'] })).json().id as string
  await bob.post('/v2/message', { recipient: group, body: 'group news' })
  await pause()
  const hidden = (await bob.post('/v2/message', { recipient: 'alice', body: 'forget this' })).json().id as string
  for (const name of ['dave', 'erin', 'frank']) {
    const other = await as(name)
    await other.post('/v2/message', { recipient: 'alice', body: `from ${name}` })
    await pause()
  }
  t.equal((await alice.delete(`/v2/message/${hidden}`)).statusCode, 204, 'hidden for alice only')
  t.equal((await alice.post(`/v2/group/${group}/members/remove`, { members: ['alice'] })).statusCode, 200, 'alice leaves')

  const seen: string[] = []
  let cursor: string | null = null
  for (let page = 0; page < 10; page++) {
    const res = await alice.get(`/v2/conversations?limit=2${cursor === null ? '' : `&cursor=${cursor}`}`)
    t.equal(res.statusCode, 200)
    seen.push(...res.json().conversations.map((c: Conversation) => c.peer))
    cursor = res.json().nextCursor
    if (cursor === null) break
  }
  t.same(seen, ['frank', 'erin', 'dave'], 'no bob (only a hidden message), no group (left), no page overlaps')
  t.same((await bob.get('/v2/conversations')).json().conversations.map((c: Conversation) => c.peer), ['alice', group], 'bob still sees both')

  for (const forged of ['x', Buffer.from('["not-a-date","msg_x"]').toString('base64url'), Buffer.from('{}').toString('base64url')]) {
    const res = await alice.get(`/v2/conversations?cursor=${forged}`)
    t.equal(res.statusCode, 400)
    t.match(res.json(), { code: 'VALIDATION_FAILED', message: /cursor/ })
  }
  t.equal((await alice.get('/v2/conversations?limit=0')).statusCode, 400)
  t.equal((await alice.get('/v2/conversations?limit=201')).statusCode, 400)
})
