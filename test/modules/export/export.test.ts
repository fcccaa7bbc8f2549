import { randomBytes } from 'node:crypto'
import { existsSync, readFileSync, statSync } from 'node:fs'
import { request, type IncomingMessage } from 'node:http'
import { connect } from 'node:net'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import t from 'tap'
import { createKeysRepository } from '../../../src/modules/keys/keys.repository.js'
import { build, type Caller, type TestContext } from '../../helper.js'
import { runCliInProcess, tempDir } from '../../support/processes.js'
import { howItEnds } from '../../support/responses.js'
import { until } from '../../support/until.js'
import { json, messageLines, unzip } from './support.js'

const ENV = { RATE_LIMIT_PER_SECOND: '100000', DAILY_MESSAGE_QUOTA: '100000' }

/** alice, bob and carol, a conversation with every kind of thing an export must carry, and an admin. */
async function setUp (t: TestContext) {
  const built = await build(t, { env: ENV })
  const alice = await built.as('alice')
  const bob = await built.as('bob')
  const carol = await built.as('carol')
  await built.createUser('root')
  const admin = built.callerFor('root', await createKeysRepository(built.db).create('root', null, { scopes: ['admin'] }))
  return { ...built, alice, bob, carol, admin }
}

async function send (from: Caller, body: Record<string, unknown> | FormData): Promise<string> {
  const res = await from.post('/v2/message', body)
  if (res.statusCode !== 200) throw new Error(`send answered ${res.statusCode}: ${res.body}`)
  return (res.json() as { id: string }).id
}

t.test('GET /v2/export: every message sent or received with statuses, edits, reactions, replies, metadata; files; groups, roster, profile', async (t) => {
  const { alice, bob, carol } = await setUp(t)
  const file = randomBytes(700 * 1024)
  const form = new FormData()
  form.append('recipient', 'bob')
  form.append('body', 'the report, canary-export-1')
  form.append('attachment', new Blob([file], { type: 'application/pdf' }), 'notes: v1?.pdf')
  const withFile = await send(alice, form)
  const hello = await send(alice, { recipient: 'bob', body: 'hello bob' })
  t.equal((await alice.patch(`/v2/message/${hello}`, { body: 'hello bob, edited' })).statusCode, 200)
  const answer = await send(bob, { recipient: 'alice', body: 'hi alice', replyTo: hello })
  t.equal((await bob.put(`/v2/message/${hello}/reactions/${encodeURIComponent('👍')}`)).statusCode, 204)
  t.equal((await bob.post('/v2/message/status', { message: hello, status: 'read' })).statusCode, 204)
  t.equal((await alice.post(`/v2/metadata/${hello}`, { pinned: true })).statusCode, 200)
  t.equal((await alice.post('/v2/metadata/alice', { city: 'Lyon' })).statusCode, 200)
  t.equal((await alice.post('/v2/roster', { entity: 'bob', name: 'Bobby' })).statusCode, 200)
  const group = await alice.post('/v2/group', { name: 'trio', members: ['bob', 'carol'] })
  t.equal(group.statusCode, 200)
  const groupId = (group.json() as { id: string }).id
  const inGroup = await send(carol, { recipient: groupId, body: 'to the group' })
  // Not alice's: between bob and carol.
  await send(bob, { recipient: 'carol', body: 'not for alice' })
  // Hidden by alice (a recipient's delete): she may no longer read it.
  const hidden = await send(bob, { recipient: 'alice', body: 'hide me' })
  t.equal((await alice.delete(`/v2/message/${hidden}`)).statusCode, 204)

  const res = await alice.get('/v2/export')
  t.equal(res.statusCode, 200)
  t.equal(res.headers['content-type'], 'application/zip')
  t.match(res.headers['content-disposition'], /^attachment; filename="parley-export-alice-\d{4}-\d{2}-\d{2}\.zip"$/)
  const { names, files } = await unzip(res.rawPayload)
  const path = `attachments/${withFile}/1-notes_ v1_.pdf`
  t.same(names, ['README.txt', 'profile.json', 'roster.json', 'groups.json', 'metadata.json', 'messages.jsonl', path], 'the files, in order; a file\'s name with characters some systems refuse is made safe')
  t.ok(files.get(path)!.equals(file), 'the attachment\'s bytes as uploaded')

  const lines = messageLines(files)
  t.same(lines.map((m) => m.id), [withFile, hello, answer, inGroup], 'what alice sent or received and may read, in order; not others\' or hidden')
  const byId = new Map(lines.map((m) => [m.id, m]))
  t.match(byId.get(withFile), { sender: 'alice', recipient: 'bob', attachments: [{ index: 1, filename: 'notes: v1?.pdf', size: file.length, file: path }] })
  t.match(byId.get(hello), {
    body: 'hello bob, edited',
    editedAt: String,
    reactions: [{ emoji: '👍', count: 1, mine: false }],
    recipients: [{ address: 'bob', status: 'read' }],
    metadata: { pinned: true }
  }, 'a sent message: its edit, reactions, each recipient\'s status, its metadata')
  t.match(byId.get(answer), { sender: 'bob', replyTo: hello, status: 'sent' }, 'a received message: its reply and alice\'s own status')
  t.notOk('recipients' in byId.get(answer)!, 'a received message lists no one else\'s status')
  t.match(byId.get(inGroup), { recipient: groupId, status: 'sent' })

  const profile = json<Record<string, unknown>>(files, 'profile.json')
  t.match(profile, { user: { address: 'alice', deactivatedAt: null }, keys: [{ keyId: alice.keyId }], webhooks: [], snapshot: Boolean, exportedAt: String })
  t.notOk(files.get('profile.json')!.toString().includes(alice.secret), 'no key secret')
  t.same(json(files, 'roster.json'), [{ entity: 'bob', type: 'user', name: 'Bobby', addedAt: (json<{ addedAt: string }[]>(files, 'roster.json'))[0]!.addedAt }])
  t.match(json(files, 'groups.json'), [{ id: groupId, name: 'trio', owner: 'alice', members: ['alice', 'bob', 'carol'], joinedAt: String, metadata: {} }])
  t.match(json(files, 'metadata.json'), { entity: 'alice', metadata: { city: 'Lyon' } })
  t.match(files.get('README.txt')!.toString(), /messages\.jsonl/)
})

t.test('GET /v2/admin/users/{user}/export: any user\'s, for the admin scope only; 404 names an unknown user; audited as user.export', async (t) => {
  const { alice, bob, admin } = await setUp(t)
  const first = await send(alice, { recipient: 'bob', body: 'one' })
  const second = await send(alice, { recipient: 'bob', body: 'two' })
  t.equal((await bob.delete(`/v2/message/${second}`)).statusCode, 204)

  const res = await admin.get('/v2/admin/users/BOB/export')
  t.equal(res.statusCode, 200)
  const { files } = await unzip(res.rawPayload)
  t.same(messageLines(files).map((m) => m.id), [first], 'bob\'s export: what bob may read (he hid the second)')
  t.match(json(files, 'profile.json'), { user: { address: 'bob' } })

  const missing = await admin.get('/v2/admin/users/nobody/export')
  t.equal(missing.statusCode, 404)
  t.match(missing.json(), { code: 'NOT_FOUND', message: /nobody/ })
  t.equal((await alice.get('/v2/admin/users/bob/export')).statusCode, 403, 'a key without the admin scope')

  t.equal((await alice.get('/v2/export')).statusCode, 200)
  const entries = (await admin.get('/v2/admin/audit?action=user.export')).json() as { entries: { actor: unknown, target: string }[] }
  t.same(entries.entries.map((e) => [e.actor, e.target]), [
    [{ key: alice.keyId, address: 'alice' }, 'alice'],
    [{ key: admin.keyId, address: 'root' }, 'bob']
  ], 'one entry per export, newest first; none for the refused ones')
})

t.test('an export of 500 messages pages through both halves without losing or repeating one', async (t) => {
  const { alice, bob } = await setUp(t)
  const sent: string[] = []
  for (let i = 0; i < 250; i++) {
    sent.push(await send(alice, { recipient: 'bob', body: `a${i}` }))
    sent.push(await send(bob, { recipient: 'alice', body: `b${i}` }))
  }
  const { files } = await unzip((await alice.get('/v2/export')).rawPayload)
  const ids = messageLines(files).map((m) => m.id)
  t.equal(ids.length, 500)
  t.same(ids, sent, 'each once, in the order they were sent')
})

/** A GET on a real server whose body is not read: the export stalls on the socket's buffers. */
async function stalledExport (base: string, authorization: string): Promise<{ res: IncomingMessage, stop: () => void }> {
  return new Promise((resolve, reject) => {
    const req = request(`${base}/v2/export`, { headers: { authorization } }, (res) => {
      res.pause()
      resolve({ res, stop: () => { req.destroy() } })
    })
    req.on('error', () => {})
    req.on('close', () => {})
    setTimeout(() => { reject(new Error('no answer in 10 s')) }, 10_000).unref()
    req.end()
  })
}

/** A user with `megabytes` MiB of files, enough to fill the socket's buffers. */
async function heavy (alice: Caller, megabytes: number): Promise<void> {
  for (let i = 0; i < megabytes; i++) {
    const form = new FormData()
    form.append('recipient', 'bob')
    form.append('attachment', new Blob([randomBytes(1024 * 1024)]), `f${i}.bin`)
    await send(alice, form)
  }
}

t.test('one export per user at a time: a second answers 429 while the first streams; a client gone frees it', async (t) => {
  const { app, alice, bob } = await setUp(t)
  await heavy(alice, 12)
  const base = await app.listen({ host: '127.0.0.1', port: 0 })
  const first = await stalledExport(base, alice.authorization)
  t.equal(first.res.statusCode, 200)
  const second = await fetch(`${base}/v2/export`, { headers: { authorization: alice.authorization } })
  t.equal(second.status, 429)
  t.match(await second.json(), { code: 'RATE_LIMITED', message: /export of alice is already running/ })
  t.equal((await fetch(`${base}/v2/export`, { headers: { authorization: bob.authorization } })).status, 200, 'another user\'s export goes ahead')
  first.stop()
  // The export notices its client went and ends: the next one is let in.
  let status = 0
  for (let i = 0; i < 50 && status !== 200; i++) {
    await sleep(100)
    const res = await fetch(`${base}/v2/export`, { headers: { authorization: alice.authorization } })
    status = res.status
    await res.arrayBuffer()
  }
  t.equal(status, 200, 'after the first client went away, an export of alice runs again')
})

t.test('a key revoked mid-export: the download is cut within the key watch\'s second, and the export\'s hold ends with it', async (t) => {
  const { app, alice, admin, logs } = await setUp(t)
  await heavy(alice, 12)
  const base = await app.listen({ host: '127.0.0.1', port: 0 })
  const { res } = await stalledExport(base, alice.authorization)
  let received = 0
  res.on('data', (chunk: Buffer) => { received += chunk.length })
  const ended = howItEnds(res)
  t.equal((await admin.delete(`/v2/admin/keys/${alice.keyId}`)).statusCode, 204)
  // The watch looks again every second; the body stays unread until the export has stopped, so
  // it is still stalled on the socket when it is told.
  await until(() => logs().includes(`key ${alice.keyId} may no longer read`), { message: 'the export stopped for the revoked key' })
  res.resume()
  const how = await ended
  t.not(how, 'end', `the response was cut (${how} after ${(received / 2 ** 20).toFixed(1)} MiB), not ended as if whole`)
  t.ok(received < 12 * 1024 * 1024, 'short of the files')
  // Its snapshot and its place are given back: an admin's export of alice runs at once.
  const again = await admin.get('/v2/admin/users/alice/export')
  t.equal(again.statusCode, 200)
  t.equal((await unzip(again.rawPayload)).names.filter((n) => n.startsWith('attachments/')).length, 12)
})

t.test('parley user export writes the archive to a new file (0600), audited as the CLI; an existing file or unknown user is refused', async (t) => {
  const { alice, database, admin } = await setUp(t)
  const id = await send(alice, { recipient: 'bob', body: 'for the file' })
  const dir = tempDir(t, 'parley-export-cli-')
  const path = join(dir, 'alice.zip')
  const done = await runCliInProcess(['user', 'export', 'alice', '--output', path, '--json'], {}, database)
  t.equal(done.code, 0, done.stderr)
  t.match(JSON.parse(done.stdout), { address: 'alice', output: path, bytes: statSync(path).size })
  t.equal(statSync(path).mode & 0o777, 0o600, 'readable by its owner only')
  t.same(messageLines((await unzip(readFileSync(path))).files).map((m) => m.id), [id])
  const again = await runCliInProcess(['user', 'export', 'alice', '--output', path], {}, database)
  t.equal(again.code, 1)
  t.match(again.stderr, /EEXIST|exists/)
  const unknown = await runCliInProcess(['user', 'export', 'nobody', '--output', join(dir, 'nobody.zip')], {}, database)
  t.equal(unknown.code, 1)
  t.match(unknown.stderr, /user nobody not found/)
  t.notOk(existsSync(join(dir, 'nobody.zip')), 'no file left for a refused export')
  t.equal((await runCliInProcess(['user', 'export', 'alice'], {}, database)).code, 2, '--output is required')
  const entries = (await admin.get('/v2/admin/audit?action=user.export')).json() as { entries: { actor: unknown, target: string }[] }
  t.same(entries.entries.map((e) => [e.actor, e.target]), [['cli', 'alice']])
})

t.test('a file\'s name in the archive stays inside its message\'s folder, whatever was stored', async (t) => {
  const { archivePath } = await import('../../../src/modules/export/export.service.js')
  for (const name of ['../../etc/passwd', '..\\..\\boot.ini', '/abs/path', 'C:\\x', '.hidden', 'a\u0000b\u202ec', '', '...']) {
    const path = archivePath('msg_x', 3, name)
    t.ok(path.startsWith('attachments/msg_x/3-') && !path.slice('attachments/msg_x/'.length).includes('/') && !path.includes('\\'), `${JSON.stringify(name)} → ${path}`)
  }
  t.equal(archivePath('msg_x', 1, 'x'.repeat(300)).length, 'attachments/msg_x/1-'.length + 100, 'at most 100 characters of the name')
})

t.test('clients that hang up while the export starts leave nothing held: the next export of the user runs', async (t) => {
  const { app, alice } = await setUp(t)
  await heavy(alice, 2)
  const base = await app.listen({ host: '127.0.0.1', port: 0 })
  const { port } = new URL(base)
  // Hung up 0-15 ms after asking: some before the snapshot is open, some while the archive starts.
  for (let i = 0; i < 20; i++) {
    const socket = connect(Number(port), '127.0.0.1')
    socket.on('error', () => {})
    socket.write(`GET /v2/export HTTP/1.1\r\nHost: x\r\nAuthorization: ${alice.authorization}\r\n\r\n`)
    await sleep(i % 16)
    socket.destroy()
  }
  let status = 0
  for (let i = 0; i < 100 && status !== 200; i++) {
    const res = await fetch(`${base}/v2/export`, { headers: { authorization: alice.authorization } })
    status = res.status
    await res.arrayBuffer()
    if (status !== 200) await sleep(100)
  }
  t.equal(status, 200, 'an export of alice runs again: none of the abandoned ones is still holding it')
})

t.test('an export still streaming at EXPORT_MAX_SECONDS is cut, and its hold ends', async (t) => {
  const built = await build(t, { env: { ...ENV, EXPORT_MAX_SECONDS: '2' } })
  const alice = await built.as('alice')
  await built.as('bob')
  await heavy(alice, 12)
  const base = await built.app.listen({ host: '127.0.0.1', port: 0 })
  const started = performance.now()
  const { res } = await stalledExport(base, alice.authorization)
  const ended = howItEnds(res)
  await until(() => built.logs().includes('EXPORT_MAX_SECONDS'), { message: 'the export stopped at its deadline' })
  res.resume()
  t.not(await ended, 'end', 'cut, not ended as if whole')
  t.ok(performance.now() - started < 10_000, 'at about the limit')
  t.ok(built.logs().includes('EXPORT_MAX_SECONDS'), 'the log says why')
  const again = await fetch(`${base}/v2/export`, { headers: { authorization: alice.authorization } })
  t.equal(again.status, 200, 'the next export runs')
  await again.arrayBuffer()
})

t.test('an export whose client stopped reading is cut when the service closes: close() does not wait for it', async (t) => {
  const { app, alice, logs } = await setUp(t)
  await heavy(alice, 12)
  const base = await app.listen({ host: '127.0.0.1', port: 0 })
  const { res } = await stalledExport(base, alice.authorization)
  const ended = howItEnds(res)
  // Before, close() waited until the export's deadline (EXPORT_MAX_SECONDS, an hour by default)
  // or the client's going; the CLI's SIGTERM ends the process after 10 s whatever is open.
  const started = performance.now()
  await app.close()
  t.ok(performance.now() - started < 30_000, `closed in ${Math.round(performance.now() - started)} ms`)
  res.resume()
  t.not(await ended, 'end', 'the download was cut, not ended as if whole')
  t.match(logs(), /the service is shutting down/, 'the log says why')
})
