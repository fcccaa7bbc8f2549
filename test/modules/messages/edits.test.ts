import { sql } from 'drizzle-orm'
import t from 'tap'
import { queryRows } from '../../../src/db/rows.js'
import { build, type Caller } from '../../helper.js'

interface Event { id: string, type: string, data: { message: { id: string, body: string, editedAt: string | null } | string } }

async function feed (caller: Caller, type: string): Promise<Event[]> {
  return ((await caller.get('/v2/events?limit=1000')).json().events as Event[]).filter((e) => e.type === type)
}

async function search (caller: Caller, query: string): Promise<string[]> {
  const res = await caller.post('/v2/search', { query, types: ['messages'] })
  return (res.json().results as { message: { body: string } }[]).map((r) => r.message.body)
}

t.test('the sender edits a message: editedAt set, message.edited to each recipient, search finds only the new text', async (t) => {
  const { as } = await build(t)
  const alice = await as('alice')
  const bob = await as('bob')
  const carol = await as('carol')
  const group = (await alice.post('/v2/group', { name: 'ops', members: ['bob', 'carol'] })).json().id as string
  const sent = (await alice.post('/v2/message', { recipient: group, body: 'meet at the harbour' })).json()
  t.equal(sent.editedAt, null)
  t.equal(sent.replyTo, null)
  // Carol hides it: no edit reaches her.
  t.equal((await carol.delete(`/v2/message/${sent.id}`)).statusCode, 204)

  const res = await alice.patch(`/v2/message/${sent.id}`, { body: 'meet at the station' })
  t.equal(res.statusCode, 200, res.body)
  const edited = res.json()
  t.match(edited, { id: sent.id, body: 'meet at the station', createdAt: sent.createdAt, editedAt: String })
  t.ok(Date.parse(edited.editedAt) >= Date.parse(sent.createdAt))
  t.same((await bob.get(`/v2/message/${sent.id}`)).json(), edited, 'a reader sees the edit')
  t.same((await feed(bob, 'message.edited')).map((e) => e.data), [{ message: edited }], 'bob is told, with the message as it now is')
  t.same(await feed(carol, 'message.edited'), [], 'carol hid it')
  t.same(await feed(alice, 'message.edited'), [], 'the editor is not told')
  t.same(await search(bob, 'station'), ['meet at the station'])
  t.same(await search(bob, 'harbour'), [], 'the old words are gone from search')
  t.equal((await bob.get(`/v2/conversations/${group}/messages`)).json().messages[0].body, 'meet at the station', 'and from the history')

  // In a form body too; the quota is not counted.
  const before = (await alice.post('/v2/message', { recipient: 'bob', body: 'x' })).headers['x-quota-remaining']
  t.equal((await alice.patch(`/v2/message/${sent.id}`, { body: 'third' }, { format: 'form' })).statusCode, 200)
  const after = (await alice.post('/v2/message', { recipient: 'bob', body: 'y' })).headers['x-quota-remaining']
  t.equal(Number(before) - Number(after), 1, 'the edit counted no quota')

  // A delete takes the edits' copies of the body with it.
  t.equal((await alice.delete(`/v2/message/${sent.id}`)).statusCode, 204)
  t.same(await feed(bob, 'message.edited'), [], 'no copy of an edited body is left in the feed')
})

t.test('who may edit, and when: the sender within the window; others, deleted and lapsed messages refused', async (t) => {
  const { as, db } = await build(t, { env: { MESSAGE_EDIT_WINDOW_SECONDS: '600', MAX_BODY_CHARS: '20' } })
  const alice = await as('alice')
  const bob = await as('bob')
  const carol = await as('carol')
  const id = (await alice.post('/v2/message', { recipient: 'bob', body: 'hello' })).json().id as string
  const cases: [Caller, string, unknown, number, RegExp][] = [
    [bob, id, { body: 'mine now' }, 403, /only the sender of message .* may edit it/],
    [carol, id, { body: 'mine now' }, 403, /visible only to its sender and recipients/],
    [alice, `msg_${'0'.repeat(26)}`, { body: 'x' }, 404, /not found/],
    [alice, id, {}, 400, /body/],
    [alice, id, { body: 'x'.repeat(21) }, 400, /body/],
    [alice, id, { body: '' }, 400, /body: must not be empty/],
    [alice, 'msg_x', { body: 'x' }, 400, /message/]
  ]
  for (const [caller, message, body, status, text] of cases) {
    const res = await caller.patch(`/v2/message/${message}`, body as Record<string, unknown>)
    t.equal(res.statusCode, status, `${caller.address} ${JSON.stringify(body)}`)
    t.match(res.json(), { statusCode: status, message: text })
  }
  t.equal((await alice.get(`/v2/message/${id}`)).json().body, 'hello', 'nothing was changed')
  // Sent 601 s ago by the database's clock: past the window.
  await db.execute(sql`UPDATE messages SET created_at = now() - interval '601 seconds' WHERE id = ${id}`)
  const late = await alice.patch(`/v2/message/${id}`, { body: 'too late' })
  t.equal(late.statusCode, 403)
  t.match(late.json().message, /can no longer be edited: edits are allowed for 600 s after sending/)
  t.equal((await bob.delete(`/v2/message/${id}`)).statusCode, 204)
  t.equal((await alice.delete(`/v2/message/${id}`)).statusCode, 204)
  t.equal((await alice.patch(`/v2/message/${id}`, { body: 'gone' })).statusCode, 404, 'a deleted message')
})

t.test('concurrent edits: the last to commit stays, and every one of them reaches the feed in order', async (t) => {
  const { as } = await build(t, { env: { RATE_LIMIT_PER_SECOND: '100000' } })
  const alice = await as('alice')
  const bob = await as('bob')
  const id = (await alice.post('/v2/message', { recipient: 'bob', body: 'v0' })).json().id as string
  const results = await Promise.all(Array.from({ length: 20 }, (_, i) => alice.patch(`/v2/message/${id}`, { body: `v${i + 1}` })))
  t.same([...new Set(results.map((r) => r.statusCode))], [200])
  const events = await feed(bob, 'message.edited')
  t.equal(events.length, 20, 'no message.edited lost')
  const bodies = events.map((e) => (e.data.message as { body: string }).body)
  t.same([...bodies].sort(), Array.from({ length: 20 }, (_, i) => `v${i + 1}`).sort(), 'one event per edit')
  t.equal((await bob.get(`/v2/message/${id}`)).json().body, bodies.at(-1), 'the message holds the last edit the feed shows')
  const stamps = events.map((e) => Date.parse((e.data.message as { editedAt: string }).editedAt))
  t.same(stamps, [...stamps].sort((a, b) => a - b), 'edits reach the feed in the order they committed')
})

t.test('an edit racing a delete: either the edit comes first or it finds the message gone; nothing of it is left', async (t) => {
  const { as, db } = await build(t, { env: { RATE_LIMIT_PER_SECOND: '100000' } })
  const alice = await as('alice')
  const bob = await as('bob')
  for (let round = 0; round < 10; round++) {
    const id = (await alice.post('/v2/message', { recipient: 'bob', body: `round ${round}` })).json().id as string
    const [edit, del] = await Promise.all([alice.patch(`/v2/message/${id}`, { body: `edited ${round}` }), alice.delete(`/v2/message/${id}`)])
    t.ok(edit.statusCode === 200 || edit.statusCode === 404, `round ${round}: edit ${edit.statusCode}`)
    t.equal(del.statusCode, 204)
  }
  const left = await queryRows<{ n: number }>(db, sql`SELECT count(*)::int AS n FROM events WHERE type IN ('message.received', 'message.edited')`)
  t.equal(left[0]!.n, 0, 'no copy of any body is left in any feed')
  t.same((await bob.get('/v2/conversations/alice/messages')).json().messages, [])
})

t.test('an edit with an Idempotency-Key: a repeat changes nothing and says so; another body under the key is 422', async (t) => {
  const { as } = await build(t)
  const alice = await as('alice')
  const bob = await as('bob')
  const id = (await alice.post('/v2/message', { recipient: 'bob', body: 'draft' })).json().id as string
  const headers = { 'idempotency-key': 'edit-1' }
  const first = await alice.patch(`/v2/message/${id}`, { body: 'final' }, { headers })
  t.equal(first.statusCode, 200)
  t.equal(first.headers['idempotent-replayed'], undefined)
  const again = await alice.patch(`/v2/message/${id}`, { body: 'final' }, { headers })
  t.equal(again.statusCode, 200)
  t.equal(again.headers['idempotent-replayed'], 'true')
  t.same(again.json(), first.json(), 'the same message, the same editedAt')
  t.equal((await feed(bob, 'message.edited')).length, 1, 'told once')
  const other = await alice.patch(`/v2/message/${id}`, { body: 'changed my mind' }, { headers })
  t.equal(other.statusCode, 422)
  t.equal(other.json().code, 'IDEMPOTENCY_MISMATCH')
})

t.test('replyTo: a reply names a readable message of the same conversation; anything else is 400 naming the field', async (t) => {
  const { as } = await build(t)
  const alice = await as('alice')
  const bob = await as('bob')
  const carol = await as('carol')
  const question = (await bob.post('/v2/message', { recipient: 'alice', body: 'lunch?' })).json().id as string
  const reply = await alice.post('/v2/message', { recipient: 'bob', body: 'yes', replyTo: question })
  t.equal(reply.statusCode, 200, reply.body)
  t.equal(reply.json().replyTo, question)
  t.equal((await bob.get(`/v2/message/${reply.json().id}`)).json().replyTo, question)
  t.match((await feed(bob, 'message.received')).at(-1), { data: { message: { replyTo: question } } }, 'the event carries it')
  // A reply to one's own message, in a multipart body.
  const form = new FormData()
  form.append('recipient', 'bob')
  form.append('body', 'and dessert')
  form.append('replyTo', reply.json().id)
  t.equal((await alice.post('/v2/message', form)).json().replyTo, reply.json().id)

  const group = (await carol.post('/v2/group', { name: 'g', members: ['alice'] })).json().id as string
  const inGroup = (await carol.post('/v2/message', { recipient: group, body: 'group topic' })).json().id as string
  const toCarol = (await bob.post('/v2/message', { recipient: 'carol', body: 'private' })).json().id as string
  const hidden = (await bob.post('/v2/message', { recipient: 'alice', body: 'hide me' })).json().id as string
  t.equal((await alice.delete(`/v2/message/${hidden}`)).statusCode, 204)
  const cases: [string, unknown, RegExp][] = [
    ['bob', inGroup, /replyTo: message .* is not in the conversation with bob/],
    [group, question, /replyTo: message .* is not in the conversation with grp_/],
    ['bob', toCarol, /replyTo: no message .* that the sender may read/],
    ['bob', hidden, /replyTo: no message .* that the sender may read/],
    ['bob', `msg_${'0'.repeat(26)}`, /replyTo: no message/],
    ['bob', 'msg_nope', /replyTo/]
  ]
  for (const [recipient, replyTo, message] of cases) {
    const res = await alice.post('/v2/message', { recipient, body: 'x', replyTo })
    t.equal(res.statusCode, 400, `reply to ${String(replyTo)} sent to ${recipient}`)
    t.match(res.json().message, message)
  }
  t.equal((await alice.post('/v2/message', { recipient: group, body: 'on topic', replyTo: inGroup })).statusCode, 200, 'a reply in the group')

  // A retry of a reply whose original was deleted meanwhile answers the reply it made.
  const original = (await bob.post('/v2/message', { recipient: 'alice', body: 'soon gone' })).json().id as string
  const headers = { 'idempotency-key': 'reply-1' }
  const first = await alice.post('/v2/message', { recipient: 'bob', body: 'answer', replyTo: original }, { headers })
  t.equal(first.statusCode, 200)
  t.equal((await bob.delete(`/v2/message/${original}`)).statusCode, 204)
  const retry = await alice.post('/v2/message', { recipient: 'bob', body: 'answer', replyTo: original }, { headers })
  t.equal(retry.statusCode, 200, retry.body)
  t.equal(retry.headers['idempotent-replayed'], 'true')
  t.equal(retry.json().id, first.json().id)
})
