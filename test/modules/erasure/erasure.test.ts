import t from 'tap'
import { createReactionFanoutsRepository } from '../../../src/modules/messages/reaction-fanouts.repository.js'
import type { TestContext } from '../../helper.js'
import { runCliInProcess } from '../../support/processes.js'
import { canary, ok, rowsWhere, setUp, tablesHolding, withFile } from './support.js'

t.test('DELETE /v2/admin/users/:user: 202 and its keys 401 at once; then nothing the user wrote is left in any table or ' +
  'readable through the API, while what others sent it stays theirs', async (t) => {
  const { admin, as, db, erased } = await setUp(t, { erasure: { graceMs: 0 } })
  const word = canary()
  const alice = await as('alice')
  const bob = await as('bob')
  const carol = await as('carol')
  const eve = await as('eve')
  ok(await admin.post('/v2/admin/users/eve', { displayName: `Eve ${word}` }))

  // What eve writes, each place with the canary: bodies (sent, edited), a file's name and bytes,
  // metadata (its own, a message's, a group's), its roster, a reaction, a webhook, an Idempotency-Key.
  const withAttachment = ok(await eve.post('/v2/message', withFile({ recipient: 'alice', body: `look ${word}` }, {
    data: Buffer.from(`bytes of ${word} in a file`), type: 'text/plain', filename: `${word}.txt`
  })))
  const plain = ok(await eve.post('/v2/message', { recipient: 'alice', body: 'first draft' }, { headers: { 'idempotency-key': word } }))
  ok(await eve.patch(`/v2/message/${plain.id}`, { body: `edited ${word}` }))
  ok(await eve.post(`/v2/metadata/${plain.id}`, { note: word }))
  ok(await eve.post('/v2/metadata/eve', { bio: word }))
  ok(await eve.post('/v2/roster', { entity: 'alice', name: `my ${word}` }))
  ok(await eve.post('/v2/webhooks', { url: `http://127.0.0.1:9/${word}` }))

  // Groups: one eve owns with carol from the start and alice added later (carol inherits it,
  // though alice sorts first); one only eve is in (deleted); one alice owns (eve just leaves).
  const kept = ok(await eve.post('/v2/group', { name: 'kept', members: ['carol'] })).id as string
  await new Promise((resolve) => setTimeout(resolve, 20))
  ok(await eve.post(`/v2/group/${kept}/members`, { members: ['alice'] }))
  const lonely = ok(await eve.post('/v2/group', { name: `lonely ${word}`, members: [] })).id as string
  ok(await eve.post(`/v2/metadata/${lonely}`, { topic: word }))
  const alices = ok(await alice.post('/v2/group', { name: 'alices', members: ['eve', 'bob'] })).id as string
  const inGroup = ok(await eve.post('/v2/message', { recipient: kept, body: `to the group ${word}` }))

  // What others send: to eve, to the groups; eve reads one, reacts to another, is replied to.
  const toEve = ok(await alice.post('/v2/message', { recipient: 'eve', body: 'hello eve', replyTo: plain.id }))
  const fromCarol = ok(await carol.post('/v2/message', { recipient: kept, body: 'carol to the group' }))
  const fromBob = ok(await bob.post('/v2/message', { recipient: alices, body: 'bob to alices' }))
  ok(await eve.post('/v2/message/status', { message: toEve.id, status: 'read' }), 204)
  ok(await eve.put(`/v2/message/${fromCarol.id}/reactions/${word}`), 204)
  ok(await carol.put(`/v2/message/${inGroup.id}/reactions/%F0%9F%91%8D`), 204)
  // And one of its reactions still queued for telling, as a process that stopped mid-fan-out leaves it.
  await createReactionFanoutsRepository(db).enqueue(fromCarol.id, { message: fromCarol.id, emoji: `${word}2`, from: 'eve', added: true }, 'eve')

  const before = await tablesHolding(db, word)
  for (const table of ['users', 'events', 'roster_entries', 'webhooks', 'message_reactions', 'groups', 'idempotency_keys', 'reaction_fanouts']) {
    t.ok(before.includes(table), `before: the canary is in ${table}`)
  }
  // Bodies, files and metadata are sealed at rest (API.md §11): no canary to find in them, so their rows are what is there.
  t.equal(await rowsWhere(db, 'metadata', 'entity', 'eve'), 1, 'before: eve\'s own metadata is stored (sealed)')
  t.ok(await rowsWhere(db, 'messages', 'sender', 'eve') >= 3, 'before: eve\'s messages are stored (sealed)')
  t.equal(await rowsWhere(db, 'attachments', 'message_id', withAttachment.id), 1, 'before: its file is stored (sealed)')
  t.ok(await rowsWhere(db, 'attachment_chunks', 'message_id', withAttachment.id) >= 1, 'before: its file\'s bytes are stored (sealed)')

  const answer = await admin.delete('/v2/admin/users/EVE')
  t.equal(answer.statusCode, 202, answer.body)
  t.match(answer.json(), { address: 'eve', displayName: null, deactivatedAt: /Z$/, erasure: 'pending' })
  t.equal((await eve.get('/v2/whoami')).statusCode, 401, 'its key is refused at once')
  t.equal((await alice.post('/v2/message', { recipient: 'eve', body: 'still there?' })).statusCode, 403, 'and it receives nothing')

  await erased('eve')
  t.same(await tablesHolding(db, word), [], 'after: no table holds the canary, as text or as bytes')
  t.match(ok(await admin.get('/v2/admin/users/eve')), { address: 'eve', displayName: null, erasure: 'done' })
  t.ok((ok(await admin.get('/v2/admin/users?query=eve')).users as { erasure: string }[]).some((u) => u.erasure === 'done'), 'the list shows it too')
  for (const [table, column] of [['messages', 'sender'], ['deliveries', 'recipient'], ['events', 'address'], ['api_keys', 'address'],
    ['webhooks', 'address'], ['roster_entries', 'owner'], ['group_members', 'address'], ['message_reactions', 'address'], ['metadata', 'entity']] as const) {
    t.equal(await rowsWhere(db, table, column, 'eve'), 0, `no ${table} row of eve`)
  }
  for (const table of ['attachments', 'attachment_chunks']) t.equal(await rowsWhere(db, table, 'message_id', withAttachment.id), 0, `no ${table} row of its file`)

  // Through the API: none of its content.
  for (const reader of [alice, bob, carol]) {
    t.same(ok(await reader.post('/v2/search', { query: word })).results, [], `${reader.address} finds nothing by search`)
  }
  for (const id of [withAttachment.id, plain.id, inGroup.id]) t.equal((await alice.get(`/v2/message/${id}`)).statusCode, 404, `eve's ${id} is gone`)
  t.equal((await alice.get(`/v2/message/${withAttachment.id}/attachment/1`)).statusCode, 404, 'its file too')
  t.same(ok(await alice.get('/v2/metadata/eve')).metadata, {}, 'no metadata about it')
  t.match(ok(await alice.get('/v2/user/eve')), { address: 'eve', displayName: null })
  const history = ok(await alice.get('/v2/conversations/eve/messages')).messages as { id: string }[]
  t.same(history.map((m) => m.id), [toEve.id], 'alice\'s history with eve: only what alice sent')

  // What others sent stays theirs; recipients were told of each deletion, as a sender's delete tells them.
  t.match(ok(await alice.get(`/v2/message/${toEve.id}`)), { body: 'hello eve', recipient: 'eve', replyTo: plain.id })
  t.match(ok(await carol.get(`/v2/message/${fromCarol.id}`)), { body: 'carol to the group', reactions: [] })
  t.match(ok(await alice.get(`/v2/message/${fromBob.id}`)), { body: 'bob to alices' })
  const feed = ok(await alice.get('/v2/events?limit=200')).events as { type: string, data: { message?: string } }[]
  const deleted = feed.filter((e) => e.type === 'message.deleted').map((e) => e.data.message).sort()
  t.same(deleted, [withAttachment.id, plain.id, inGroup.id].sort(), 'alice got message.deleted for each of eve\'s messages she had')
  t.notOk(JSON.stringify(feed).includes(word), 'and her feed holds no copy of them')

  // Groups: passed to the longest-standing member, deleted when empty, left otherwise.
  const passed = ok(await carol.get(`/v2/group/${kept}`))
  t.same([passed.owner, passed.members], ['carol', ['alice', 'carol']], 'eve\'s group passed to carol, its longest-standing member')
  t.equal((await carol.get(`/v2/group/${lonely}`)).statusCode, 404, 'the group only eve was in is gone')
  const left = ok(await alice.get(`/v2/group/${alices}`))
  t.same([left.owner, left.members], ['alice', ['alice', 'bob']], 'eve left alice\'s group')
  ok(await carol.post(`/v2/group/${kept}`, { name: 'carol\'s now' }))

  // The record: one user.erase entry, by the admin's key, in the request's transaction.
  const entries = ok(await admin.get('/v2/admin/audit?action=user.erase')).entries
  t.match(entries, [{ action: 'user.erase', target: 'eve', actor: { key: admin.keyId, address: 'root' }, requestId: answer.headers['x-request-id'] }])
  t.ok((ok(await admin.get('/v2/admin/audit?target=eve')).entries as unknown[]).length >= 2, 'earlier entries about eve stay')
})

t.test('erasure is idempotent, 404 for no such user, and the address stays reserved', async (t) => {
  const { admin, app, as, erased, runCli } = await withCli(t)
  const dana = await as('dana')
  const alice = await as('alice')
  ok(await dana.post('/v2/message', { recipient: 'alice', body: 'bye' }))

  const missing = await admin.delete('/v2/admin/users/nobody')
  t.equal(missing.statusCode, 404)
  t.same(missing.json(), { statusCode: 404, error: 'Not Found', message: 'user nobody not found', code: 'NOT_FOUND' })
  t.equal((await alice.delete('/v2/admin/users/dana')).statusCode, 403, 'an admin key only')

  // The first request wakes the job, which may be done before the second (a grace of 0 here).
  const first = ok(await admin.delete('/v2/admin/users/dana'), 202)
  t.equal(first.erasure, 'pending')
  const again = ok(await admin.delete('/v2/admin/users/dana'), 202)
  t.same({ ...again, erasure: 'pending' }, first, 'asked again: 202, nothing changed (the first times stay)')
  await erased('dana')
  const done = ok(await admin.delete('/v2/admin/users/dana'), 202)
  t.same({ ...done, erasure: 'pending' }, first, 'asked again once done: 202, the user as it stands')
  t.equal(done.erasure, 'done')
  const entries = ok(await admin.get('/v2/admin/audit?action=user.erase&target=dana')).entries as unknown[]
  t.equal(entries.length, 3, 'each request is recorded')

  for (const [what, res] of [
    ['creating it again', admin.post('/v2/admin/users', { address: 'DANA' })],
    ['reactivating it', admin.post('/v2/admin/users/dana', { deactivated: false })],
    ['renaming it', admin.post('/v2/admin/users/dana', { displayName: 'Dana' })],
    ['a key for it', admin.post('/v2/admin/keys', { address: 'dana' })]
  ] as const) {
    const refused = await res
    t.equal(refused.statusCode, 409, what)
    t.match(refused.json(), { code: 'CONFLICT', message: /user dana is erased .*address stays reserved/ }, what)
  }
  t.match(ok(await admin.post('/v2/admin/users/dana', { deactivated: true })), { erasure: 'done' }, 'deactivating it again is harmless')
  t.match(ok(await admin.get('/v2/admin/users/dana')), { deactivatedAt: /Z$/, displayName: null, erasure: 'done' })
  t.match(ok(await admin.get('/v2/admin/users/alice')), { erasure: null }, 'null for a user never erased')

  // The CLI: the same refusals, and its own erase command (actor cli).
  const reactivate = await runCli('user', 'reactivate', 'dana')
  t.equal(reactivate.code, 1)
  t.match(reactivate.stderr, /user dana is erased/)
  t.match((await runCli('key', 'create', 'dana')).stderr, /user dana is erased/)
  t.match((await runCli('user', 'erase', 'nobody')).stderr, /user nobody not found/)
  const byCli = await runCli('user', 'erase', 'alice', '--json')
  t.equal(byCli.code, 0, byCli.stderr)
  t.match(JSON.parse(byCli.stdout), { address: 'alice', erasure: 'pending', deactivatedAt: /Z$/ })
  t.match(ok(await admin.get('/v2/admin/audit?action=user.erase&target=alice')).entries, [{ actor: 'cli', requestId: null, ip: null }])
  t.match((await runCli('user', 'erase', '--help')).stdout, /Usage: parley user erase <address>/)
  // A running service finds it on its next look (a minute at most); this one looks now.
  app.erasure.wake()
  await erased('alice')
  t.match((await runCli('user', 'erase', 'alice')).stdout, /alice is erased already/)
})

async function withCli (t: TestContext) {
  const built = await setUp(t, { erasure: { graceMs: 0 } })
  return { ...built, runCli: (...args: string[]) => runCliInProcess(args, {}, built.database) }
}

t.test('an erased user joins no group, and a group it owned passes to an active member before a deactivated one', async (t) => {
  const { admin, as, erased } = await setUp(t, { erasure: { graceMs: 0 } })
  const owner = await as('olga')
  await as('vera')
  await as('ann')
  await as('zed')
  // vera joined first but is deactivated: the group goes to ann, the longest-standing active member.
  const group = ok(await owner.post('/v2/group', { name: 'club', members: ['vera'] }))
  ok(await owner.post(`/v2/group/${group.id}/members`, { members: ['ann'] }))
  ok(await admin.post('/v2/admin/users/vera', { deactivated: true }))
  ok(await admin.delete('/v2/admin/users/olga'), 202)
  await erased('olga')
  const ann = await as('ann')
  t.match(ok(await ann.get(`/v2/group/${group.id}`)), { owner: 'ann' }, 'ann, not the deactivated vera, owns it now')

  const zed = await as('zed')
  for (const [what, res] of [
    ['in a new group', zed.post('/v2/group', { name: 'new', members: ['olga'] })],
    ['added to one', ann.post(`/v2/group/${group.id}/members`, { members: ['olga'] })]
  ] as const) {
    const refused = await res
    t.equal(refused.statusCode, 409, what)
    t.match(refused.json(), { code: 'CONFLICT', message: 'user olga has been erased; its address is reserved and cannot join a group' }, what)
  }
})
