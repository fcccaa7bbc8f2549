import { execFile } from 'node:child_process'
import { createHash, randomBytes, randomInt } from 'node:crypto'
import { existsSync, readdirSync } from 'node:fs'
import { promisify } from 'node:util'
import { sql } from 'drizzle-orm'
import t from 'tap'
import { queryRows } from '../../src/db/rows.js'
import { CHUNK_BYTES } from '../../src/modules/messages/attachment-chunks.repository.js'
import { build, type Built, type Caller, type TestContext } from '../helper.js'
import { unzip } from '../modules/export/support.js'
import { until } from '../support/until.js'
import { startReceiver } from '../support/webhook-receiver.js'

/**
 * Issue #33's acceptance test (API.md §11, content sealed at rest): a database filled through
 * the API with a distinct canary string in every place a message's content reaches holds none
 * of them, in any case, as any prefix of 8 characters or more (what a tsvector of the words
 * stored), nor as the hex of their bytes (how bytea dumps); and every canary still comes back
 * through the API. On PostgreSQL the database is read through pg_dump (data only, and with the
 * schema); on PGlite every table of every schema is read row by row.
 */

const ENV = { WEBHOOK_ALLOW_PRIVATE: 'true', RATE_LIMIT_PER_SECOND: '100000', DAILY_MESSAGE_QUOTA: '100000' }
const BOT = 'testbot'

// ---------------------------------------------------------------------------------------------
// Canaries

/**
 * Letters that are not hexadecimal digits, both cases: a canary's first 8 characters (its
 * shortest prefix that must not leak) are drawn from them, so they never turn up by chance in
 * the hex of a bytea or of a hash, and base64 ciphertext matches them (case-insensitively) with
 * odds of 2^-40 per position.
 */
const NOT_HEX = 'ghijkmnopqrstuvwxyzGHIJKMNOPQRSTUVWXYZ'
const PREFIX_CHARS = 8

/**
 * One word of letters and digits (search splits words at anything else), unique per place and
 * run: 10 random letters, then the place's name for a person reading a dump, then random hex.
 */
function canary (tag: string): string {
  return `${notHex(10)}Canary${tag}${randomBytes(4).toString('hex')}`
}

const notHex = (length: number): string => Array.from({ length }, () => NOT_HEX[randomInt(NOT_HEX.length)]).join('')

const hex = (text: string): string => Buffer.from(text, 'utf8').toString('hex')

/** A form of a canary that must not be in the database, searched for in lower-cased text. */
interface Needle { form: string, text: string }

/** What betrays a canary word: itself in any case, its first 8 characters (so any prefix of 8 or more), and the hex of either. */
function wordNeedles (word: string): Needle[] {
  const prefix = word.slice(0, PREFIX_CHARS)
  return [
    { form: 'whole, any case', text: word.toLowerCase() },
    { form: `its first ${PREFIX_CHARS} characters, any case`, text: prefix.toLowerCase() },
    { form: 'hex of its bytes', text: hex(word) },
    { form: 'hex of its bytes lower-cased', text: hex(word.toLowerCase()) },
    { form: `hex of its first ${PREFIX_CHARS} characters`, text: hex(prefix) },
    { form: `hex of its first ${PREFIX_CHARS} characters lower-cased`, text: hex(prefix.toLowerCase()) }
  ]
}

/** A place content goes, the canary put there, and the forms of it that must not be stored. */
interface Place { name: string, canary: string, needles: Needle[] }

function place (name: string, word: string): Place {
  return { name, canary: word, needles: wordNeedles(word) }
}

/**
 * The control: a user's address, which stays plain by design (who wrote to whom stays visible,
 * API.md §11). A reading of the database that does not find it read no rows, and would prove
 * nothing by finding no canary.
 */
function makeControl (): Place {
  return place('the control (a user\'s address, plain by design)', `${notHex(10).toLowerCase()}control`)
}

/** Every place of this run, each with its own canary. */
function makePlaces () {
  const toBot = canary('ToBot')
  const smallType = canary('SmallType').toLowerCase()
  const largeType = canary('LargeType').toLowerCase()
  return {
    direct: place('a 1:1 message body', canary('Direct')),
    group: place('a group message body', canary('Group')),
    editedOld: place('an edited message\'s old body', canary('EditedOld')),
    editedNew: place('an edited message\'s new body', canary('EditedNew')),
    reply: place('a reply\'s body', canary('Reply')),
    toBot: place('a body sent to the test bot (its reply echoes it)', toBot),
    // The reply's own text, so a leak of the reply and not of the message it answers shows as such.
    botReply: { name: 'the test bot\'s reply body', canary: `echo: ${toBot}`, needles: [{ form: 'whole, any case', text: `echo: ${toBot}`.toLowerCase() }, { form: 'hex of its bytes', text: hex(`echo: ${toBot}`) }] },
    idempotent: place('an idempotent send\'s body', canary('Idempotent')),
    withFiles: place('the body of a message with files', canary('WithFiles')),
    smallBytes: place('a small (inline) file\'s bytes', canary('SmallBytes')),
    smallName: place('a small file\'s name', canary('SmallName')),
    smallType: place('a small file\'s content type', smallType),
    largeHead: place('a large file\'s bytes, at its start', canary('LargeHead')),
    largeBoundary: place('a large file\'s bytes, across its chunk boundaries', canary('LargeBoundary')),
    largeTail: place('a large file\'s bytes, at its end', canary('LargeTail')),
    largeName: place('a large file\'s name', canary('LargeName')),
    largeType: place('a large file\'s content type', largeType),
    userMeta: place('a user\'s metadata value', canary('UserMeta')),
    groupMeta: place('a group\'s metadata value', canary('GroupMeta')),
    messageMeta: place('a message\'s metadata value', canary('MessageMeta'))
  }
}
type Places = ReturnType<typeof makePlaces>

// ---------------------------------------------------------------------------------------------
// Files

/** A small file (stored inline with its send): text around the canary. */
function smallFile (p: Places): Buffer {
  return Buffer.from(`a small file\n${p.smallBytes.canary}\nthe end\n`, 'utf8')
}

const LARGE_SIZE = 2 * CHUNK_BYTES + 12_345

/** Where the boundary canary sits: straddling each chunk boundary, at least 8 characters on either side. */
const boundaryOffsets = (word: string): number[] => [CHUNK_BYTES, 2 * CHUNK_BYTES].map((edge) => edge - Math.floor(word.length / 2))

/** A file of three chunks: random bytes, a canary at its start, one across each chunk boundary, one at its end. */
function largeFile (p: Places): Buffer {
  const bytes = randomBytes(LARGE_SIZE)
  const put = (text: string, at: number) => { Buffer.from(text, 'utf8').copy(bytes, at) }
  put(p.largeHead.canary, 0)
  for (const at of boundaryOffsets(p.largeBoundary.canary)) put(p.largeBoundary.canary, at)
  put(p.largeTail.canary, LARGE_SIZE - p.largeTail.canary.length)
  return bytes
}

/** The plain SHA-256 of a file: not its content, but it confirms a guess of it (the groundwork seals attachments.sha256). */
function fingerprint (name: string, bytes: Buffer): Place {
  const digest = createHash('sha256').update(bytes).digest('hex')
  return { name, canary: digest, needles: [{ form: 'hex SHA-256', text: digest }] }
}

// ---------------------------------------------------------------------------------------------
// The API

interface Attachment { index: number, filename: string, contentType: string, size: number }
interface Message { id: string, sender: string, recipient: string, body: string, attachments: Attachment[], replyTo: string | null, editedAt: string | null }
interface Event { id: string, type: string, data: unknown }

async function expectStatus (what: string, status: number, response: Promise<{ statusCode: number, body: string }>): Promise<void> {
  const res = await response
  if (res.statusCode !== status) throw new Error(`${what} answered ${res.statusCode}, not ${status}: ${res.body}`)
}

async function send (from: Caller, fields: Record<string, unknown> | FormData, headers: Record<string, string> = {}): Promise<Message> {
  const res = await from.post('/v2/message', fields, { headers })
  if (res.statusCode !== 200) throw new Error(`${from.address}'s send answered ${res.statusCode}: ${res.body}`)
  return res.json<Message>()
}

async function history (caller: Caller, peer: string): Promise<Message[]> {
  const res = await caller.get(`/v2/conversations/${encodeURIComponent(peer)}/messages?limit=200`)
  if (res.statusCode !== 200) throw new Error(`${caller.address}'s history with ${peer} answered ${res.statusCode}: ${res.body}`)
  return res.json<{ messages: Message[] }>().messages
}

async function feed (caller: Caller): Promise<Event[]> {
  return (await caller.get('/v2/events?limit=1000')).json<{ events: Event[] }>().events
}

/** The ids of the messages a search finds, newest first. */
async function searchIds (caller: Caller, query: string): Promise<string[]> {
  const res = await caller.post('/v2/search', { query, types: ['messages'], limit: 50 })
  if (res.statusCode !== 200) throw new Error(`${caller.address}'s search for ${query} answered ${res.statusCode}: ${res.body}`)
  return res.json<{ results: { type: string, message?: Message }[] }>().results.flatMap((r) => r.message === undefined ? [] : [r.message.id])
}

async function metadataOf (caller: Caller, entity: string): Promise<string> {
  const res = await caller.get(`/v2/metadata/${encodeURIComponent(entity)}`)
  if (res.statusCode !== 200) throw new Error(`metadata of ${entity} answered ${res.statusCode}: ${res.body}`)
  return JSON.stringify(res.json<{ metadata: unknown }>().metadata)
}

// ---------------------------------------------------------------------------------------------
// Filling the database

interface Filled {
  alice: Caller
  bob: Caller
  carol: Caller
  groupId: string
  direct: Message
  inGroup: Message
  edited: Message
  reply: Message
  toBot: Message
  botReply: Message
  idempotent: Message
  withFiles: Message
  small: Buffer
  large: Buffer
  webhookPayloads: () => string[]
}

/**
 * alice, bob and carol, a group of the three, and one of each thing that carries content, each
 * with its canary; bob's webhook delivers his whole feed to a receiver on loopback. Resolves
 * once the bot has replied and every event of bob's feed is recorded as delivered.
 */
async function fill (t: TestContext, built: Built, p: Places): Promise<Filled> {
  const alice = await built.as('alice')
  const bob = await built.as('bob')
  const carol = await built.as('carol')
  const receiver = await startReceiver(t)
  const hook = await bob.post('/v2/webhooks', { url: receiver.url })
  if (hook.statusCode !== 200) throw new Error(`the webhook answered ${hook.statusCode}: ${hook.body}`)
  const hookId = hook.json<{ id: string }>().id

  const direct = await send(alice, { recipient: 'bob', body: `Dear bob, ${p.direct.canary} (the first)` })
  await expectStatus('bob\'s reaction', 204, bob.put(`/v2/message/${direct.id}/reactions/${encodeURIComponent('👍')}`))
  const reply = await send(bob, { recipient: 'alice', body: `re: ${p.reply.canary}`, replyTo: direct.id })

  const group = await alice.post('/v2/group', { name: 'trio', members: ['bob', 'carol'] })
  if (group.statusCode !== 200) throw new Error(`the group answered ${group.statusCode}: ${group.body}`)
  const groupId = group.json<{ id: string }>().id
  const inGroup = await send(carol, { recipient: groupId, body: `to all: ${p.group.canary}` })

  const original = await send(alice, { recipient: 'bob', body: `first draft ${p.editedOld.canary}` })
  const patched = await alice.patch(`/v2/message/${original.id}`, { body: `second draft ${p.editedNew.canary}` })
  if (patched.statusCode !== 200) throw new Error(`the edit answered ${patched.statusCode}: ${patched.body}`)
  const edited = patched.json<Message>()

  const once = { 'idempotency-key': `canary-${randomBytes(4).toString('hex')}` }
  const idempotent = await send(alice, { recipient: 'bob', body: `only once: ${p.idempotent.canary}` }, once)
  const repeated = await send(alice, { recipient: 'bob', body: `only once: ${p.idempotent.canary}` }, once)
  if (repeated.id !== idempotent.id) throw new Error(`the repeated idempotent send made another message (${repeated.id}, not ${idempotent.id})`)

  const small = smallFile(p)
  const large = largeFile(p)
  const form = new FormData()
  form.append('recipient', 'bob')
  form.append('body', `two files: ${p.withFiles.canary}`)
  form.append('attachment', new Blob([new Uint8Array(small)], { type: `application/x-${p.smallType.canary}` }), `notes ${p.smallName.canary}.txt`)
  form.append('attachment', new Blob([new Uint8Array(large)], { type: `application/x-${p.largeType.canary}` }), `${p.largeName.canary}.bin`)
  const withFiles = await send(alice, form)

  await expectStatus('alice\'s metadata', 200, alice.post('/v2/metadata/alice', { note: p.userMeta.canary, plain: 42 }))
  await expectStatus('the group\'s metadata', 200, alice.post(`/v2/metadata/${groupId}`, { topic: { text: `about ${p.groupMeta.canary}`, pinned: true } }))
  await expectStatus('the message\'s metadata', 200, alice.post(`/v2/metadata/${direct.id}`, { labels: ['keep', p.messageMeta.canary] }))

  const toBot = await send(alice, { recipient: BOT, body: p.toBot.canary })
  let botReply: Message | undefined
  await until(async () => {
    botReply = (await history(alice, BOT)).find((m) => m.sender === BOT && m.replyTo === toBot.id)
    return botReply !== undefined
  }, { timeoutMs: 10_000, intervalMs: 100, message: 'the test bot never replied' })

  // Every event of bob's feed delivered to his webhook and recorded so.
  await until(async () => {
    const events = await feed(bob)
    const log = (await bob.get(`/v2/webhooks/${hookId}/deliveries?limit=100`)).json<{ deliveries: { event: string, status: string }[] }>().deliveries
    const delivered = new Set(log.filter((d) => d.status === 'delivered').map((d) => d.event))
    return events.length > 0 && events.every((e) => delivered.has(e.id))
  }, { timeoutMs: 20_000, intervalMs: 100, message: 'bob\'s webhook never delivered his whole feed' })

  return {
    alice,
    bob,
    carol,
    groupId,
    direct,
    inGroup,
    edited,
    reply,
    toBot,
    botReply: botReply!,
    idempotent,
    withFiles,
    small,
    large,
    webhookPayloads: () => receiver.delivered().map((r) => r.body)
  }
}

// ---------------------------------------------------------------------------------------------
// Reading the database

/** Text read from the database, and where it came from (a table, a dump's section). */
interface Haystack { where: string, text: string }

/** Each place's traces: one line per haystack that holds any of its needles (`where: form, form…`), none when it is sealed. */
function traces (places: Place[], haystacks: Haystack[]): Map<Place, string[]> {
  const lowered = haystacks.map((h) => ({ where: h.where, text: h.text.toLowerCase() }))
  return new Map(places.map((p) => [p, lowered.flatMap((h) => {
    const forms = p.needles.filter((n) => h.text.includes(n.text)).map((n) => n.form)
    return forms.length === 0 ? [] : [`${h.where}: ${forms.join('; ')}`]
  })]))
}

const execFileAsync = promisify(execFile)

/** The newest pg_dump installed (a newer one dumps an older server), else the one on PATH. */
function pgDumpBinary (): string {
  const root = '/usr/lib/postgresql'
  const versions = existsSync(root) ? readdirSync(root).filter((v) => /^\d+$/.test(v)).sort((a, b) => Number(b) - Number(a)) : []
  for (const version of versions) {
    const path = `${root}/${version}/bin/pg_dump`
    if (existsSync(path)) return path
  }
  return 'pg_dump'
}

/** A dump split by what it holds: each table's COPY rows, and everything outside them (definitions, sequences, comments). */
async function pgDump (url: string, args: string[]): Promise<Haystack[]> {
  const { stdout } = await execFileAsync(pgDumpBinary(), [...args, '--no-owner', `--dbname=${url}`], { maxBuffer: 512 * 1024 * 1024, encoding: 'utf8' })
  const outside = 'outside any table\'s rows'
  const sections = new Map<string, string[]>()
  let current = outside
  for (const line of stdout.split('\n')) {
    const copy = /^COPY (\S+) /.exec(line)
    if (copy !== null) current = `rows of ${copy[1]}`
    else if (line === '\\.') current = outside
    else {
      const lines = sections.get(current) ?? []
      lines.push(line)
      sections.set(current, lines)
    }
  }
  if (![...sections.keys()].some((where) => where.startsWith('rows of '))) throw new Error(`pg_dump ${args.join(' ')} holds no table's rows`)
  return [...sections].map(([where, lines]) => ({ where, text: lines.join('\n') }))
}

/** A column's value as text every way it might hold a canary: bytea as hex and decoded as UTF-8 and Latin-1. */
function valueTexts (value: unknown): string[] {
  if (value === null || value === undefined) return []
  if (value instanceof Uint8Array) {
    const bytes = Buffer.from(value.buffer, value.byteOffset, value.byteLength)
    return [bytes.toString('hex'), bytes.toString('utf8'), bytes.toString('latin1')]
  }
  if (Array.isArray(value)) return value.flatMap(valueTexts)
  if (value instanceof Date) return [value.toISOString()]
  if (typeof value === 'object') return [JSON.stringify(value)]
  return [String(value)]
}

/** Every row of every table in every schema but the system's, one haystack per table. */
async function readEveryTable (built: Built): Promise<Haystack[]> {
  const tables = await queryRows<{ name: string }>(built.db, sql`
    SELECT format('%I.%I', n.nspname, c.relname) AS name FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.relkind IN ('r', 'p', 'm') AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\\_%'
    ORDER BY 1`)
  if (!tables.some((table) => table.name === 'public.messages')) throw new Error(`the tables listed miss public.messages: ${tables.map((table) => table.name).join(', ')}`)
  const haystacks: Haystack[] = []
  for (const { name } of tables) {
    const rows = await queryRows<Record<string, unknown>>(built.db, sql.raw(`SELECT * FROM ${name}`))
    haystacks.push({ where: `table ${name}`, text: rows.flatMap((row) => Object.values(row).flatMap(valueTexts)).join('\n') })
  }
  return haystacks
}

// ---------------------------------------------------------------------------------------------

t.test('sealed at rest: no canary in the database, every canary through the API', async (t) => {
  const built = await build(t, { env: ENV })
  const p = makePlaces()
  const control = makeControl()
  await built.createUser(control.canary)
  const f = await fill(t, built, p)
  const all: Place[] = [
    ...Object.values(p),
    fingerprint('a small file\'s plain SHA-256', f.small),
    fingerprint('a large file\'s plain SHA-256', f.large)
  ]

  // The database: none of them, in any form.
  const sources: { source: string, read: () => Promise<Haystack[]> }[] = built.url !== undefined
    ? [
        { source: 'pg_dump --data-only', read: () => pgDump(built.url!, ['--data-only']) },
        { source: 'pg_dump (schema and data)', read: () => pgDump(built.url!, []) }
      ]
    : [{ source: 'every table\'s rows (PGlite)', read: () => readEveryTable(built) }]
  for (const { source, read } of sources) {
    const found = traces([control, ...all], await read())
    t.ok(found.get(control)!.some((where) => where.includes('users')), `${control.name}: found in ${source}'s users, so it reads the rows`)
    for (const leaked of all) t.same(found.get(leaked), [], `${leaked.name}: no trace in ${source}`)
  }

  // The API: every one of them.
  const { alice, bob, carol, groupId } = f
  const withBob = await history(alice, 'bob')
  const bodyIn = (messages: Message[], id: string) => messages.find((m) => m.id === id)?.body
  t.equal(bodyIn(withBob, f.direct.id), `Dear bob, ${p.direct.canary} (the first)`, `${p.direct.name}: in alice's history with bob`)
  t.equal(bodyIn(withBob, f.edited.id), `second draft ${p.editedNew.canary}`, `${p.editedNew.name}: in alice's history with bob`)
  t.notOk(withBob.some((m) => m.body.includes(p.editedOld.canary)), `${p.editedOld.name}: no longer in the history`)
  t.equal(bodyIn(withBob, f.reply.id), `re: ${p.reply.canary}`, `${p.reply.name}: in alice's history with bob`)
  t.equal(bodyIn(withBob, f.idempotent.id), `only once: ${p.idempotent.canary}`, `${p.idempotent.name}: in alice's history with bob`)
  t.equal(withBob.filter((m) => m.body.includes(p.idempotent.canary)).length, 1, `${p.idempotent.name}: sent once`)
  t.equal(bodyIn(withBob, f.withFiles.id), `two files: ${p.withFiles.canary}`, `${p.withFiles.name}: in alice's history with bob`)
  t.equal(bodyIn(await history(bob, groupId), f.inGroup.id), `to all: ${p.group.canary}`, `${p.group.name}: in the group's history`)
  const withBot = await history(alice, BOT)
  t.equal(bodyIn(withBot, f.toBot.id), p.toBot.canary, `${p.toBot.name}: in alice's history with the bot`)
  t.equal(bodyIn(withBot, f.botReply.id), p.botReply.canary, `${p.botReply.name}: in alice's history with the bot`)
  const conversations = (await alice.get('/v2/conversations')).json<{ conversations: { peer: string, lastMessage: Message }[] }>().conversations
  t.equal(conversations.find((c) => c.peer === BOT)?.lastMessage.body, p.botReply.canary, `${p.botReply.name}: the last message of alice's conversation with the bot`)

  // Files: the message object's names and types, the bytes, a range across a chunk boundary.
  const got = (await bob.get(`/v2/message/${f.withFiles.id}`)).json<Message>()
  t.same(got.attachments, [
    { index: 1, filename: `notes ${p.smallName.canary}.txt`, contentType: `application/x-${p.smallType.canary}`, size: f.small.length },
    { index: 2, filename: `${p.largeName.canary}.bin`, contentType: `application/x-${p.largeType.canary}`, size: f.large.length }
  ], `${p.smallName.name}, ${p.smallType.name}, ${p.largeName.name}, ${p.largeType.name}: in the message`)
  const smallDownload = await bob.get(`/v2/message/${f.withFiles.id}/attachment/1`)
  t.ok(smallDownload.statusCode === 200 && smallDownload.rawPayload.equals(f.small), `${p.smallBytes.name}: downloaded as sent`)
  t.equal(smallDownload.headers['content-type'], `application/x-${p.smallType.canary}`, `${p.smallType.name}: the download's Content-Type`)
  t.match(smallDownload.headers['content-disposition'], p.smallName.canary, `${p.smallName.name}: the download's Content-Disposition`)
  const largeDownload = await bob.get(`/v2/message/${f.withFiles.id}/attachment/2`)
  t.ok(largeDownload.statusCode === 200 && largeDownload.rawPayload.equals(f.large), `${p.largeHead.name}, ${p.largeBoundary.name}, ${p.largeTail.name}: downloaded as sent`)
  t.equal(largeDownload.headers['content-type'], `application/x-${p.largeType.canary}`, `${p.largeType.name}: the download's Content-Type`)
  t.match(largeDownload.headers['content-disposition'], p.largeName.canary, `${p.largeName.name}: the download's Content-Disposition`)
  const from = boundaryOffsets(p.largeBoundary.canary)[0]! - 100
  const to = from + 100 + p.largeBoundary.canary.length + 100
  const range = await bob.get(`/v2/message/${f.withFiles.id}/attachment/2`, { headers: { range: `bytes=${from}-${to - 1}` } })
  t.equal(range.statusCode, 206, 'a range across the first chunk boundary: 206')
  t.ok(range.rawPayload.equals(f.large.subarray(from, to)) && range.rawPayload.toString('latin1').includes(p.largeBoundary.canary),
    `${p.largeBoundary.name}: a range across the boundary holds it whole`)
  const tail = await bob.get(`/v2/message/${f.withFiles.id}/attachment/2`, { headers: { range: `bytes=-${p.largeTail.canary.length}` } })
  t.equal(tail.rawPayload.toString('latin1'), p.largeTail.canary, `${p.largeTail.name}: a suffix range is exactly it`)

  // Metadata.
  t.match(await metadataOf(bob, 'alice'), p.userMeta.canary, `${p.userMeta.name}: GET /v2/metadata/alice`)
  t.match(await metadataOf(carol, groupId), p.groupMeta.canary, `${p.groupMeta.name}: GET /v2/metadata/{group}`)
  t.match(await metadataOf(bob, f.direct.id), p.messageMeta.canary, `${p.messageMeta.name}: GET /v2/metadata/{message}`)

  // The events' copies: bob's feed (and what his webhook was sent), alice's feed.
  const bobFeed = JSON.stringify(await feed(bob))
  const aliceFeed = JSON.stringify(await feed(alice))
  const webhook = f.webhookPayloads().join('\n')
  for (const received of [p.direct, p.group, p.editedNew, p.idempotent, p.withFiles, p.smallName, p.smallType, p.largeName, p.largeType]) {
    t.ok(bobFeed.includes(received.canary), `${received.name}: in bob's events feed`)
    t.ok(webhook.includes(received.canary), `${received.name}: delivered to bob's webhook`)
  }
  for (const received of [p.reply, p.botReply, p.group]) t.ok(aliceFeed.includes(received.canary), `${received.name}: in alice's events feed`)

  // Search: each body's canary word finds its message, a prefix of it too; the old body no longer.
  const searches: [Place, Caller, string[]][] = [
    [p.direct, bob, [f.direct.id]],
    [p.group, carol, [f.inGroup.id]],
    [p.editedNew, bob, [f.edited.id]],
    [p.editedOld, alice, []],
    [p.reply, alice, [f.reply.id]],
    [p.toBot, alice, [f.botReply.id, f.toBot.id]],
    [p.idempotent, bob, [f.idempotent.id]],
    [p.withFiles, bob, [f.withFiles.id]]
  ]
  for (const [searched, caller, ids] of searches) t.same(await searchIds(caller, searched.canary), ids, `${searched.name}: POST /v2/search by ${caller.address}`)
  t.same(await searchIds(alice, `echo ${p.toBot.canary}`), [f.botReply.id], `${p.botReply.name}: POST /v2/search`)
  t.same(await searchIds(bob, p.direct.canary.slice(0, 12).toUpperCase()), [f.direct.id], `${p.direct.name}: found by a 12-character prefix in upper case`)

  // alice's export: every canary but the old body, the files byte for byte.
  const exported = await alice.get('/v2/export')
  t.equal(exported.statusCode, 200, 'GET /v2/export')
  const { files } = await unzip(exported.rawPayload)
  const archive = [...files.values()].map((bytes) => bytes.toString('latin1')).join('\n')
  for (const kept of Object.values(p).filter((q) => q !== p.editedOld)) t.ok(archive.includes(kept.canary), `${kept.name}: in alice's export`)
  const exportedFiles = [...files].filter(([name]) => name.startsWith(`attachments/${f.withFiles.id}/`)).map(([, bytes]) => bytes)
  t.ok(exportedFiles.some((bytes) => bytes.equals(f.small)), `${p.smallBytes.name}: the export's file, byte for byte`)
  t.ok(exportedFiles.some((bytes) => bytes.equals(f.large)), `${p.largeBoundary.name}: the export's file, byte for byte`)
})
