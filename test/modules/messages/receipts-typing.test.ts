import t from 'tap'
import { sql } from 'drizzle-orm'
import { build, type Caller } from '../../helper.js'

async function feed (caller: Caller) {
  return (await caller.get('/v2/events?limit=1000')).json().events as { type: string, data: Record<string, unknown> }[]
}

t.test('GET /v2/message/:id/status: the sender sees every recipient, a recipient only itself', async (t) => {
  const { as } = await build(t)
  const alice = await as('alice')
  const bob = await as('bob')
  const carol = await as('carol')
  const dave = await as('dave')
  const group = (await alice.post('/v2/group', { name: 'g', members: ['bob', 'carol'] })).json()
  const sent = (await alice.post('/v2/message', { recipient: group.id, body: 'hi' })).json()
  const mine = await alice.get(`/v2/message/${sent.id}/status`)
  t.equal(mine.statusCode, 200)
  t.match(mine.json(), { message: sent.id, recipients: [{ address: 'bob', status: 'sent', updatedAt: /Z$/ }, { address: 'carol', status: 'sent' }] })
  const bobs = (await bob.get(`/v2/message/${sent.id}/status`)).json()
  t.same(bobs.recipients.map((r: { address: string }) => r.address), ['bob'])
  t.equal((await dave.get(`/v2/message/${sent.id}/status`)).statusCode, 403)
  t.equal((await carol.get('/v2/message/msg_00000000000000000000000000/status')).statusCode, 404)
})

t.test('POST /v2/message/status moves forward only and tells the sender of each change', async (t) => {
  const { as } = await build(t)
  const alice = await as('alice')
  const bob = await as('bob')
  const carol = await as('carol')
  const sent = (await alice.post('/v2/message', { recipient: 'bob', body: 'hi' })).json()

  t.equal((await bob.post('/v2/message/status', { message: sent.id, status: 'delivered' })).statusCode, 204)
  t.equal((await bob.post('/v2/message/status', { message: sent.id, status: 'read' }, { format: 'form' })).statusCode, 204)
  t.equal((await bob.post('/v2/message/status', { message: sent.id, status: 'delivered' })).statusCode, 204, 'not ahead: a no-op, still 204')
  t.equal((await bob.post('/v2/message/status', { message: sent.id, status: 'read' })).statusCode, 204)
  t.match((await alice.get(`/v2/message/${sent.id}/status`)).json(), { recipients: [{ address: 'bob', status: 'read' }] })
  const statusEvents = (await feed(alice)).filter((e) => e.type === 'message.status')
  t.same(statusEvents.map((e) => e.data), [
    { message: sent.id, recipient: 'bob', status: 'delivered' },
    { message: sent.id, recipient: 'bob', status: 'read' }
  ], 'one event per change')

  const other = (await alice.post('/v2/message', { recipient: 'bob', body: 'again' })).json()
  t.equal((await bob.post('/v2/message/status', { message: other.id, status: 'read' })).statusCode, 204)
  t.match((await alice.get(`/v2/message/${other.id}/status`)).json(), { recipients: [{ status: 'read' }] }, 'read implies delivered')

  t.match((await alice.post('/v2/message/status', { message: sent.id, status: 'read' })).json(), { statusCode: 403, code: 'FORBIDDEN' }, 'not the sender')
  t.equal((await carol.post('/v2/message/status', { message: sent.id, status: 'read' })).statusCode, 403)
  t.equal((await bob.post('/v2/message/status', { message: 'msg_00000000000000000000000000', status: 'read' })).statusCode, 404)
  t.match((await bob.post('/v2/message/status', { message: sent.id, status: 'sent' })).json(), { statusCode: 400, message: /status/ })
  t.match((await bob.post('/v2/message/status', { status: 'read' })).json(), { statusCode: 400, message: /message/ })
})

t.test('typing: started lapses after 15 s, stopped follows; groups reach each other member', async (t) => {
  const { as, db } = await build(t)
  const alice = await as('alice')
  const bob = await as('bob')
  const carol = await as('carol')
  const dave = await as('dave')
  // Typing reaches only users who know the typist (API.md §13): bob lists alice.
  t.equal((await bob.post('/v2/roster', { entity: 'alice' })).statusCode, 200)
  t.equal((await alice.post('/v2/message/typing', { recipient: 'bob' })).statusCode, 204)
  const [started] = await feed(bob)
  t.match(started, { type: 'typing.started', data: { from: 'alice', to: 'bob' } })
  const expiresAt = Date.parse(started!.data.expiresAt as string)
  t.ok(Math.abs(expiresAt - Date.now() - 15_000) < 3_000, 'expires 15 s later')

  t.equal((await alice.delete('/v2/message/typing/bob')).statusCode, 204)
  t.match((await feed(bob)).at(-1), { type: 'typing.stopped', data: { from: 'alice', to: 'bob' } })

  await db.execute(sql`UPDATE events SET expires_at = now() - interval '1 second' WHERE type = 'typing.started'`)
  t.same((await feed(bob)).map((e) => e.type), ['typing.stopped'], 'a lapsed typing.started is no longer returned')

  const group = (await alice.post('/v2/group', { name: 'g', members: ['bob', 'carol'] })).json()
  t.equal((await bob.post('/v2/message/typing', { recipient: group.id }, { format: 'form' })).statusCode, 204)
  t.match((await feed(alice)).at(-1), { type: 'typing.started', data: { from: 'bob', to: group.id } })
  t.match((await feed(carol)).at(-1), { type: 'typing.started', data: { from: 'bob', to: group.id } })
  t.notOk((await feed(bob)).some((e) => e.type === 'typing.started' && e.data.from === 'bob'), 'not to the typist')
  t.equal((await dave.post('/v2/message/typing', { recipient: group.id })).statusCode, 403)
  t.equal((await dave.delete(`/v2/message/typing/${group.id}`)).statusCode, 403)
  t.equal((await alice.post('/v2/message/typing', { recipient: 'nobody' })).statusCode, 404)
  t.equal((await alice.post('/v2/message/typing', {})).statusCode, 400)
})
