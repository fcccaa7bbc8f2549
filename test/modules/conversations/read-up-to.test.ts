import t from 'tap'
import { build, type Caller } from '../../helper.js'

interface Event { type: string, data: Record<string, unknown> }

async function events (caller: Caller, type: string): Promise<Event[]> {
  const res = await caller.get('/v2/events?limit=1000')
  return (res.json().events as Event[]).filter((e) => e.type === type)
}

async function unread (caller: Caller, peer: string): Promise<number | undefined> {
  const list = (await caller.get('/v2/conversations')).json().conversations as { peer: string, unread: number }[]
  return list.find((c) => c.peer === peer)?.unread
}

async function statuses (caller: Caller, ids: string[]): Promise<string[]> {
  return Promise.all(ids.map(async (id) => (await caller.get(`/v2/message/${id}/status`)).json().recipients[0].status as string))
}

t.test('read up to a message: earlier messages from the peer become read, later ones stay unread, one event', async (t) => {
  const { as } = await build(t)
  const alice = await as('alice')
  const bob = await as('bob')
  const carol = await as('carol')
  const ids: string[] = []
  for (let i = 0; i < 5; i++) ids.push((await bob.post('/v2/message', { recipient: 'alice', body: `b${i}` })).json().id as string)
  const mine = (await alice.post('/v2/message', { recipient: 'bob', body: 'a reply' })).json().id as string
  const fromCarol = (await carol.post('/v2/message', { recipient: 'alice', body: 'other conversation' })).json().id as string
  t.equal(await unread(alice, 'bob'), 5)

  const res = await alice.post('/v2/conversations/bob/read', { upTo: ids[2] })
  t.equal(res.statusCode, 204, res.body)
  t.same(await statuses(bob, ids), ['read', 'read', 'read', 'sent', 'sent'], 'up to and including upTo, no further')
  t.equal(await unread(alice, 'bob'), 2, 'the conversation list agrees')
  t.equal(await unread(alice, 'carol'), 1, 'another conversation is untouched')
  t.same(await statuses(carol, [fromCarol]), ['sent'])
  t.same((await events(bob, 'conversation.read')).map((e) => e.data), [{ reader: 'alice', conversation: 'alice', upTo: ids[2] }], 'one event for three messages')
  t.same(await events(bob, 'message.status'), [], 'not one per message')

  // Forward only: reading up to an earlier message changes nothing and tells nobody.
  t.equal((await alice.post('/v2/conversations/bob/read', { upTo: ids[0] })).statusCode, 204)
  t.equal((await events(bob, 'conversation.read')).length, 1)
  // Up to one's own message: everything from the peer before it, in a form body too.
  t.equal((await alice.post('/v2/conversations/BOB/read', { upTo: mine }, { format: 'form' })).statusCode, 204)
  t.equal(await unread(alice, 'bob'), 0)
  t.same(await statuses(bob, ids), ['read', 'read', 'read', 'read', 'read'])
  t.equal((await events(bob, 'conversation.read')).length, 2)
})

t.test('in a group, each sender gets one conversation.read naming the group', async (t) => {
  const { as } = await build(t)
  const alice = await as('alice')
  const bob = await as('bob')
  const carol = await as('carol')
  const group = (await alice.post('/v2/group', { name: 'ops', members: ['bob', 'carol'] })).json().id as string
  for (let i = 0; i < 3; i++) {
    await bob.post('/v2/message', { recipient: group, body: `b${i}` })
    await carol.post('/v2/message', { recipient: group, body: `c${i}` })
  }
  const last = (await carol.post('/v2/message', { recipient: group, body: 'last' })).json().id as string
  t.equal(await unread(alice, group), 7)
  t.equal((await alice.post(`/v2/conversations/${group}/read`, { upTo: last })).statusCode, 204)
  t.equal(await unread(alice, group), 0)
  t.equal(await unread(bob, group), 4, 'bob\'s own unread count is his')
  for (const sender of [bob, carol]) {
    t.same((await events(sender, 'conversation.read')).map((e) => e.data), [{ reader: 'alice', conversation: group, upTo: last }], `${sender.address}: one event`)
  }
})

t.test('a message arriving while a read is made stays unread when it comes after upTo', async (t) => {
  const { as } = await build(t, { env: { RATE_LIMIT_PER_SECOND: '100000', DAILY_MESSAGE_QUOTA: '100000' } })
  const alice = await as('alice')
  const bob = await as('bob', { dailyQuota: 100_000 })
  const first = (await bob.post('/v2/message', { recipient: 'alice', body: 'first' })).json().id as string
  // Sends and reads race; each read is up to the message it was given.
  const sent: string[] = [first]
  const reads: string[] = []
  await Promise.all([
    (async () => {
      for (let i = 0; i < 30; i++) sent.push((await bob.post('/v2/message', { recipient: 'alice', body: `m${i}` })).json().id as string)
    })(),
    (async () => {
      for (let i = 0; i < 15; i++) {
        const upTo = sent.at(-1)!
        t.equal((await alice.post('/v2/conversations/bob/read', { upTo })).statusCode, 204)
        reads.push(upTo)
      }
    })()
  ])
  const reached = reads.reduce((a, b) => (a > b ? a : b))
  const status = await statuses(bob, sent)
  t.same(sent.filter((_, i) => status[i] === 'read'), sent.filter((id) => id <= reached), 'read exactly the messages up to the furthest upTo')
  t.equal(await unread(alice, 'bob'), sent.filter((id) => id > reached).length, 'and the rest count as unread')
})

t.test('read: the conversation and upTo are checked, naming what is wrong', async (t) => {
  const { as } = await build(t)
  const alice = await as('alice')
  const bob = await as('bob')
  const carol = await as('carol')
  const toCarol = (await bob.post('/v2/message', { recipient: 'carol', body: 'not yours' })).json().id as string
  const toAlice = (await bob.post('/v2/message', { recipient: 'alice', body: 'yours' })).json().id as string
  const fromCarol = (await carol.post('/v2/message', { recipient: 'alice', body: 'from carol' })).json().id as string
  const group = (await bob.post('/v2/group', { name: 'ops', members: ['carol'] })).json().id as string
  const cases: [string, unknown, number, RegExp][] = [
    ['/v2/conversations/bob/read', { upTo: toCarol }, 403, /visible only/],
    ['/v2/conversations/bob/read', { upTo: `msg_${'0'.repeat(26)}` }, 404, /message msg_0+ not found/],
    ['/v2/conversations/carol/read', { upTo: toAlice }, 400, /upTo: message .* is not in the conversation with carol/],
    ['/v2/conversations/bob/read', { upTo: 'nope' }, 400, /upTo/],
    ['/v2/conversations/bob/read', {}, 400, /upTo/],
    ['/v2/conversations/nobody/read', { upTo: toAlice }, 404, /user nobody not found/],
    [`/v2/conversations/${group}/read`, { upTo: toAlice }, 403, /members only/]
  ]
  for (const [url, body, status, message] of cases) {
    const res = await alice.post(url, body as Record<string, unknown>)
    t.equal(res.statusCode, status, `${url} ${JSON.stringify(body)}`)
    t.match(res.json(), { statusCode: status, message }, url)
  }
  t.equal(await unread(alice, 'bob'), 1, 'nothing was marked')
  t.equal(await unread(alice, 'carol'), 1)
  t.same(await statuses(carol, [fromCarol]), ['sent'])
})
