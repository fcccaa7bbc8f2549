import t from 'tap'
import { MESSAGE_PURGE_BATCH, purgeExpired } from '../../../src/modules/retention/retention.js'
import { build, type Caller } from '../../helper.js'
import { age, holdOffAppSweeps, rowsAbout } from './support.js'

const ENV = { MESSAGE_RETENTION_DAYS: '30', RATE_LIMIT_PER_SECOND: '100000' }

/** A message with a small attachment, through the API (multipart). */
async function sendWithFile (from: Caller, recipient: string, body: string, headers: Record<string, string> = {}): Promise<string> {
  const form = new FormData()
  form.append('recipient', recipient)
  form.append('body', body)
  form.append('attachment', new Blob([`the file of ${body}`], { type: 'text/plain' }), 'notes.txt')
  const res = await from.post('/v2/message', form, { headers })
  if (res.statusCode !== 200) throw new Error(`send answered ${res.statusCode}: ${res.body}`)
  return res.json().id
}

/** Every event of `caller`'s feed, as JSON text. */
async function feed (caller: Caller): Promise<string> {
  const res = await caller.get('/v2/events?limit=1000')
  return JSON.stringify(res.json().events)
}

t.test('a sweep purges messages older than MESSAGE_RETENTION_DAYS with every row about them; nothing of them is readable; newer ones stay', async (t) => {
  const { as, db, config } = await build(t, { env: ENV })
  await holdOffAppSweeps(db)
  const alice = await as('alice')
  const bob = await as('bob')
  const carol = await as('carol')
  const group = (await alice.post('/v2/group', { name: 'ops', members: ['bob', 'carol'] })).json().id as string

  // Old: a 1:1 message with a file, a reaction, a read receipt, an edit, metadata and an
  // Idempotency-Key; a group message with a file and a reaction.
  const old1 = await sendWithFile(alice, 'bob', 'ancient plans', { 'idempotency-key': 'plans-1' })
  t.equal((await bob.put(`/v2/message/${old1}/reactions/%F0%9F%91%8D`)).statusCode, 204)
  t.equal((await bob.post('/v2/message/status', { message: old1, status: 'read' })).statusCode, 204)
  t.equal((await alice.patch(`/v2/message/${old1}`, { body: 'ancient plans, revised' })).statusCode, 200)
  t.equal((await alice.post(`/v2/metadata/${old1}`, { pinned: true })).statusCode, 200)
  const old2 = await sendWithFile(alice, group, 'ancient minutes')
  t.equal((await carol.put(`/v2/message/${old2}/reactions/ok`)).statusCode, 204)
  // Kept: a message one day short of the limit, and a new one, each with a file.
  const edge = await sendWithFile(alice, 'bob', 'edge notes')
  const fresh = await sendWithFile(alice, group, 'fresh minutes')
  t.equal((await bob.put(`/v2/message/${fresh}/reactions/ok`)).statusCode, 204)
  await age(db, [old1, old2], 31)
  await age(db, [edge], 29)
  const old = [old1, old2]
  t.ok(await rowsAbout(db, 'events', 'message_id', old) >= 4, 'their events were there')

  const swept = await purgeExpired(db, 0, config.auditRetentionDays, { messageRetentionDays: config.messageRetentionDays })
  t.match(swept, { ran: true, messages: 2 }, 'the two old messages, in one sweep')

  for (const [table, column] of [['messages', 'id'], ['attachments', 'message_id'], ['attachment_chunks', 'message_id'], ['deliveries', 'message_id'],
    ['message_reactions', 'message_id'], ['events', 'message_id'], ['metadata', 'entity']] as const) {
    t.equal(await rowsAbout(db, table, column, old), 0, `no ${table} row about them`)
    t.ok(await rowsAbout(db, table, column, [edge, fresh]) > 0 || table === 'metadata', `the kept ones' ${table} rows stay`)
  }

  for (const caller of [alice, bob, carol]) {
    for (const id of old) {
      t.equal((await caller.get(`/v2/message/${id}`)).statusCode, 404, `${caller.address}: ${id} is gone`)
      t.equal((await caller.get(`/v2/message/${id}/attachment/1`)).statusCode, 404, `${caller.address}: its file too`)
    }
    t.notMatch(await feed(caller), new RegExp(`${old1}|${old2}|ancient`), `${caller.address}'s feed holds nothing of them`)
  }
  t.match(await feed(bob), /fresh minutes/, 'the new message\'s event stays')
  t.notMatch(await feed(bob), /message\.deleted/, 'a purge tells no one: no message.deleted')
  t.equal((await bob.get(`/v2/message/${fresh}/attachment/1`)).body, 'the file of fresh minutes')
  t.equal((await bob.get(`/v2/message/${edge}`)).statusCode, 200)

  const history = await bob.get('/v2/conversations/alice/messages')
  t.same(history.json().messages.map((m: { id: string }) => m.id), [edge], 'the 1:1 history holds the kept message only')
  const groupHistory = await carol.get(`/v2/conversations/${group}/messages`)
  t.same(groupHistory.json().messages.map((m: { id: string }) => m.id), [fresh], 'and the group\'s')
  t.same((await bob.post('/v2/search', { query: 'ancient', types: ['messages'] })).json().results, [], 'search finds no old word')
  t.same((await bob.post('/v2/search', { query: 'minutes', types: ['messages'] })).json().results.map((r: { message: { id: string } }) => r.message.id), [fresh])
  const conversations = (await bob.get('/v2/conversations')).json().conversations as { peer: string, lastMessage: { id: string } }[]
  t.same(conversations.map((c) => [c.peer, c.lastMessage.id]).sort(), [[group, fresh], ['alice', edge]].sort())
  t.equal((await alice.get(`/v2/metadata/${old1}`)).statusCode, 404, 'its metadata is gone with it')

  // The Idempotency-Key still knows its send (it holds no body): a retry answers that the
  // message is gone rather than sending it again.
  const form = new FormData()
  form.append('recipient', 'bob')
  form.append('body', 'ancient plans')
  form.append('attachment', new Blob(['the file of ancient plans'], { type: 'text/plain' }), 'notes.txt')
  const retry = await alice.post('/v2/message', form, { headers: { 'idempotency-key': 'plans-1' } })
  t.equal(retry.statusCode, 404, 'a retry of the purged send is not sent again')

  t.match(await purgeExpired(db, 0, config.auditRetentionDays, { messageRetentionDays: 30 }), { ran: true, messages: 0 }, 'a second sweep finds nothing more')
  await age(db, [edge], 31)
  t.match(await purgeExpired(db, 0, config.auditRetentionDays, { messageRetentionDays: 30 }), { ran: true, messages: 1 }, 'the edge message once it too is past')
})

t.test('without MESSAGE_RETENTION_DAYS and no group retention, nothing is purged however old', async (t) => {
  const { as, db, config } = await build(t)
  await holdOffAppSweeps(db)
  t.equal(config.messageRetentionDays, undefined)
  const alice = await as('alice')
  await as('bob')
  const id = (await alice.post('/v2/message', { recipient: 'bob', body: 'keep me' })).json().id as string
  await age(db, [id], 36_600)
  t.match(await purgeExpired(db), { ran: true, messages: 0 })
  t.equal((await alice.get(`/v2/message/${id}`)).statusCode, 200)
})

t.test('the batch is bounded', async (t) => {
  t.ok(MESSAGE_PURGE_BATCH >= 100 && MESSAGE_PURGE_BATCH <= 1000, `${MESSAGE_PURGE_BATCH} messages a transaction`)
})
