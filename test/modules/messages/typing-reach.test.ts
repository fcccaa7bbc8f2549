import { sql } from 'drizzle-orm'
import t from 'tap'
import { queryRows } from '../../../src/db/rows.js'
import { build, type Caller } from '../../helper.js'
import { webhooksSettled } from '../../support/webhook-dispatch.js'
import { startReceiver } from '../../support/webhook-receiver.js'

// Typing reaches only users who know the typist (API.md §13); a webhook with no filter gets
// every type but typing.*. A real receiver on loopback: WEBHOOK_ALLOW_PRIVATE.
const ENV = { WEBHOOK_ALLOW_PRIVATE: 'true', RATE_LIMIT_PER_SECOND: '100000' }

async function typingIn (caller: Caller): Promise<{ type: string, data: { from: string } }[]> {
  const events = (await caller.get('/v2/events?limit=1000')).json().events as { type: string, data: { from: string } }[]
  return events.filter((e) => e.type.startsWith('typing.'))
}

t.test('typing to a stranger answers 204 and writes no event and no webhook delivery', async (t) => {
  const { app, as, db } = await build(t, { env: ENV })
  const receiver = await startReceiver(t)
  const mallory = await as('mallory')
  const bob = await as('bob')
  // bob asks for typing explicitly, so nothing but the rule keeps it from his webhook.
  const hook = (await bob.post('/v2/webhooks', { url: receiver.url, events: ['typing.started', 'typing.stopped', 'message.received'] })).json()
  for (let i = 0; i < 30; i++) {
    t.equal((await mallory.post('/v2/message/typing', { recipient: 'bob' })).statusCode, 204)
    t.equal((await mallory.delete('/v2/message/typing/bob')).statusCode, 204)
  }
  t.same(await typingIn(bob), [], 'no typing event in the stranger\'s target feed')
  await webhooksSettled([app])
  t.equal(receiver.received.length, 0, 'no webhook POST')
  const rows = await queryRows<{ n: number }>(db, sql`SELECT count(*)::int AS n FROM webhook_deliveries WHERE webhook_id = ${hook.id}`)
  t.equal(rows[0]!.n, 0, 'no delivery row')
  t.equal((await mallory.post('/v2/message/typing', { recipient: 'nobody' })).statusCode, 404, 'an unknown user is still 404')
})

t.test('typing reaches a user after a message either way, in a shared group, or listed in their roster', async (t) => {
  const { as } = await build(t, { env: ENV })
  const alice = await as('alice')
  const bob = await as('bob')
  const carol = await as('carol')
  const dave = await as('dave')
  const erin = await as('erin')
  // bob: alice wrote to him. carol: she wrote to alice. dave: a group with alice. erin: alice in her roster.
  t.equal((await alice.post('/v2/message', { recipient: 'bob', body: 'hi' })).statusCode, 200)
  t.equal((await carol.post('/v2/message', { recipient: 'alice', body: 'hi' })).statusCode, 200)
  t.equal((await dave.post('/v2/group', { name: 'g', members: ['alice'] })).statusCode, 200)
  t.equal((await erin.post('/v2/roster', { entity: 'alice' })).statusCode, 200)
  for (const peer of [bob, carol, dave, erin]) {
    t.equal((await alice.post('/v2/message/typing', { recipient: peer.address })).statusCode, 204)
    t.match(await typingIn(peer), [{ type: 'typing.started', data: { from: 'alice' } }], `${peer.address} is told`)
  }
  // alice lists frank in her own roster: that alone (one-sided) does not reach him.
  const frank = await as('frank')
  t.equal((await alice.post('/v2/roster', { entity: 'frank' })).statusCode, 200)
  t.equal((await alice.post('/v2/message/typing', { recipient: 'frank' })).statusCode, 204)
  t.same(await typingIn(frank), [], 'the typist\'s own roster entry does not count')
})

t.test('a webhook registered without events gets every type but typing.*', async (t) => {
  const { app, as } = await build(t, { env: ENV })
  const receiver = await startReceiver(t)
  const alice = await as('alice')
  const bob = await as('bob')
  const hook = (await bob.post('/v2/webhooks', { url: receiver.url })).json()
  t.equal(hook.events, null, 'stored with no filter: the default')
  t.equal((await alice.post('/v2/message', { recipient: 'bob', body: 'first' })).statusCode, 200)
  t.equal((await alice.post('/v2/message/typing', { recipient: 'bob' })).statusCode, 204)
  t.equal((await alice.post('/v2/message', { recipient: 'bob', body: 'second' })).statusCode, 200)
  t.match((await typingIn(bob)).map((e) => e.type), ['typing.started'], 'the feed has the typing event')
  await receiver.until(() => receiver.received.length >= 2)
  await webhooksSettled([app])
  t.same(receiver.received.map((r) => r.event.type), ['message.received', 'message.received'], 'the webhook does not')
})
