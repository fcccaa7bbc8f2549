import { Readable } from 'node:stream'
import { piecesLength } from '../../sealing/pieces.js'
import { finished } from 'node:stream/promises'
import type { ZipFile } from 'yazl'
import type { Database, Db } from '../../db/client.js'
import { readSnapshot } from '../../db/snapshot.js'
import { giveTheLoopATurn } from '../../db/turns.js'
import { RateLimited } from '../../errors.js'
import { audited, type AuditSource } from '../audit/audit.service.js'
import { CHUNK_BYTES, createAttachmentChunksRepository } from '../messages/attachment-chunks.repository.js'
import { createMessagesRepository, type MessageFields } from '../messages/messages.repository.js'
import type { Message } from '../messages/messages.schemas.js'
import { createGroupsRepository, toGroup } from '../groups/groups.repository.js'
import { createKeysRepository, toKey } from '../keys/keys.repository.js'
import { createMetadataRepository } from '../metadata/metadata.repository.js'
import { createRosterRepository, toRosterEntry } from '../roster/roster.repository.js'
import { toAdminUser, createUsersRepository } from '../users/users.repository.js'
import { createWebhooksRepository, toWebhook } from '../webhooks/webhooks.repository.js'
import { createExportRepository, type ExportRepository, type MessagePlace, type ReceivedFields } from './export.repository.js'

/** Ends an archive's output short (yazl's outputStream is a PassThrough; its types say only ReadableStream). */
export function cutArchive (zip: ZipFile, err?: Error): void {
  (zip.outputStream as Readable).destroy(err)
}

/** Refused: an export of this user is running already (here, or on another instance). */
export const exportBusy = (address: string) => new RateLimited(`an export of ${address} is already running; one at a time`)

/** Messages read per statement; a page's statuses, files and reactions take one statement each. */
const PAGE = 200
/** Roster entries and groups read per statement. */
const LIST_PAGE = 100

/** What the archive's README.txt says, so a person opening it knows what each file is. */
const README = `A Parley export: everything the service holds of one user.

profile.json    the user, its API keys (never their secrets) and webhooks (never their secrets)
roster.json     its roster, oldest entry first
groups.json     the groups it belongs to or owns, with their members and metadata
metadata.json   its own metadata
messages.jsonl  one JSON object a line: every message it sent or received and may still read,
                oldest first, with edits (editedAt), reactions, replies
                (replyTo), metadata, and statuses: "recipients" on those it sent, "status"
                on those it received; each attachment names its file under attachments/
attachments/    each file as uploaded: attachments/<message id>/<n>-<file name>
missing.txt     (only if any) files deleted while the export was being written
`

/** One export's progress, for the caller to stop it when its client goes. */
export interface ExportRun {
  /** Stops the export, saying why: the entry being written fails, and so does `done`. */
  abort(reason: string): void
}

/**
 * Exports `address` into `zip` for `source` (a request's key, or the CLI): inside a snapshot
 * (db/snapshot.ts) that holds the user's export lock on PostgreSQL, the audit entry first (in
 * its own transaction: the snapshot is read-only), then the archive. `started` is told once
 * the archive is being written, with the way to stop it; before that, a refusal (busy) throws
 * and nothing was written. Resolves when the last entry has been read from the database.
 */
export async function runExport (database: Pick<Database, 'db' | 'driver'>, address: string, zip: ZipFile, source: AuditSource, started: (run: ExportRun) => void): Promise<void> {
  await readSnapshot(database, async (reader, consistent) => {
    if (consistent && !await createExportRepository(reader).tryLock(address)) throw exportBusy(address)
    await audited(database.db, source, async (_tx, record) => { await record('user.export', address) })
    const { run, done } = startExport(reader, zip, address, consistent)
    started(run)
    await done
  })
}

/**
 * Writes one user's data into `zip` (API.md §14), reading through `reader` (a snapshot, or the
 * database page by page: db/snapshot.ts). Each entry is added when the one before it has been
 * written out, and each is a stream pulled page by page as the client downloads, so memory
 * stays one page of messages or one read of chunks whatever the user holds; the archive's
 * central directory (a few hundred bytes a file) is all that grows. Ends the zip.
 */
function startExport (reader: Db, zip: ZipFile, address: string, consistent: boolean): { run: ExportRun, done: Promise<void> } {
  let current: Readable | undefined
  let stopped: Error | undefined
  const run: ExportRun = {
    abort (reason) {
      stopped ??= new Error(`export stopped: ${reason}`)
      current?.destroy(stopped)
    }
  }
  /**
   * Adds an entry from `source` and resolves once the archive has taken all of it. Stopped, it
   * rejects only once `source` has finished the step it was in: a generator reading the
   * database must not go on using the snapshot's connection after the snapshot gave it back.
   */
  const add = async (name: string, source: AsyncIterable<string | Buffer> | (string | Buffer)[], options: { compress: boolean, mtime?: Date }) => {
    if (stopped !== undefined) throw stopped
    const iterator = Array.isArray(source) ? undefined : source[Symbol.asyncIterator]()
    const stream = Readable.from(iterator === undefined ? source : { [Symbol.asyncIterator]: () => iterator }, { objectMode: false })
    current = stream
    zip.addReadStream(stream, name, options)
    try {
      await finished(stream)
    } catch (err) {
      await iterator?.return?.(undefined).catch(() => {})
      throw err
    }
  }
  const done = (async () => {
    const repo = createExportRepository(reader)
    const until = await repo.now()
    await add('README.txt', [README], { compress: true })
    await add('profile.json', [JSON.stringify(await profile(reader, address, until, consistent), null, 2)], { compress: true })
    await add('roster.json', jsonArray(rosterEntries(reader, address)), { compress: true })
    await add('groups.json', jsonArray(groupsOf(reader, repo, address)), { compress: true })
    await add('metadata.json', [JSON.stringify(await createMetadataRepository(reader).get(address), null, 2)], { compress: true })
    await add('messages.jsonl', messageLines(reader, repo, address, until), { compress: true })
    const chunks = createAttachmentChunksRepository(reader)
    // Without a snapshot (the embedded database), a message deleted since messages.jsonl was
    // written has lost its files: they are listed in missing.txt rather than fail the export.
    const missing: string[] = []
    for await (const file of filesOf(repo, address, until)) {
      const first = file.size === 0 ? [] : await chunks.readChunk(file.uploadId, 0)
      if (first === undefined) missing.push(file.path)
      else await add(file.path, fileBytes(chunks, file.uploadId, file.size, first), { compress: false, mtime: file.createdAt })
    }
    if (missing.length > 0) {
      await add('missing.txt', [`Files deleted while this export was being written, not in it:\n${missing.join('\n')}\n`], { compress: true })
    }
    zip.end()
  })()
  return { run, done }
}

async function profile (reader: Db, address: string, until: Date, consistent: boolean) {
  const user = await createUsersRepository(reader).find(address)
  if (user === undefined) throw new Error(`user ${address} vanished during its export`)
  return {
    exportedAt: until.toISOString(),
    // Whether every file shows one moment (PostgreSQL's snapshot), or each its own read, with
    // nothing newer than exportedAt (the embedded database).
    snapshot: consistent,
    user: toAdminUser(user),
    keys: (await createKeysRepository(reader).list(address)).map(toKey),
    webhooks: (await createWebhooksRepository(reader).list(address)).map(toWebhook)
  }
}

/** A JSON array written element by element. */
async function * jsonArray (items: AsyncIterable<unknown>): AsyncGenerator<string> {
  let first = true
  for await (const item of items) {
    yield (first ? '[\n' : ',\n') + JSON.stringify(item)
    first = false
  }
  yield first ? '[]\n' : '\n]\n'
}

async function * rosterEntries (reader: Db, address: string) {
  const roster = createRosterRepository(reader)
  for (let after: { at: string, id: string } | undefined; ;) {
    const rows = await roster.page(address, after, LIST_PAGE)
    yield * rows.map(toRosterEntry)
    if (rows.length < LIST_PAGE) return
    const last = rows[rows.length - 1]!
    after = { at: last.addedAt.toISOString(), id: last.entity }
  }
}

async function * groupsOf (reader: Db, repo: ExportRepository, address: string) {
  const groups = createGroupsRepository(reader)
  for (let after: string | undefined; ;) {
    const ids = await repo.groupIds(address, after, LIST_PAGE)
    const joined = await repo.joinedAt(address, ids)
    const metadata = await repo.metadataOf(ids)
    for (const id of ids) {
      const row = await groups.find(id)
      if (row === undefined) continue
      yield { ...toGroup(row, await groups.members(id)), joinedAt: joined.get(id) ?? null, metadata: metadata.get(id) ?? {} }
    }
    if (ids.length < LIST_PAGE) return
    after = ids[ids.length - 1]
  }
}

/** A message as the export writes it: its wire form, its files' places in the archive, statuses and metadata. */
type ExportedMessage = Omit<Message, 'attachments'> & {
  attachments: (Message['attachments'][number] & { file: string })[]
  metadata?: Record<string, unknown>
} & ({ recipients: unknown[] } | { status: ReceivedFields['status'] })

/** A file's name inside the archive: its message, its number, and its own name made safe for any unzip. */
export function archivePath (messageId: string, n: number, filename: string): string {
  // No directories, no control or reserved characters, no leading dots; at most 100 characters.
  const safe = filename.replace(/[\p{Cc}\p{Cf}/\\:*?"<>|]+/gu, '_').replace(/^[.\s]+/, '').slice(0, 100)
  return `attachments/${messageId}/${n}-${safe === '' ? 'file' : safe}`
}

/** Reads one half of the user's messages a page at a time, after the last one it gave. */
type PageReader<T> = (after: T | undefined) => Promise<T[]>

/**
 * Both halves of the user's messages, sent and received, each read a page at a time from its
 * own index and merged in the order they were sent; yielded in batches of up to PAGE, each
 * message marked with the half it came from.
 */
async function * readableMessages<S extends MessagePlace, R extends MessagePlace> (
  readSent: PageReader<S>, readReceived: PageReader<R>
): AsyncGenerator<({ sent: S } | { received: R })[]> {
  let sent: S[] = []
  let received: R[] = []
  let lastSent: S | undefined
  let lastReceived: R | undefined
  let sentDone = false
  let receivedDone = false
  let batch: ({ sent: S } | { received: R })[] = []
  for (;;) {
    if (sent.length === 0 && !sentDone) {
      sent = await readSent(lastSent)
      sentDone = sent.length < PAGE
      lastSent = sent[sent.length - 1] ?? lastSent
    }
    if (received.length === 0 && !receivedDone) {
      received = await readReceived(lastReceived)
      receivedDone = received.length < PAGE
      lastReceived = received[received.length - 1] ?? lastReceived
    }
    const s = sent[0]
    const r = received[0]
    if (s === undefined && r === undefined) break
    const takeSent = r === undefined || (s !== undefined && (s.createdAt < r.createdAt || (s.createdAt.getTime() === r.createdAt.getTime() && s.id < r.id)))
    batch.push(takeSent ? { sent: sent.shift()! } : { received: received.shift()! })
    if (batch.length === PAGE) {
      yield batch
      batch = []
    }
  }
  if (batch.length > 0) yield batch
}

async function * messageLines (reader: Db, repo: ExportRepository, address: string, until: Date): AsyncGenerator<string> {
  const messages = createMessagesRepository(reader)
  const pages = readableMessages<MessageFields, ReceivedFields>(
    async (after) => repo.sentPage(address, until, after, PAGE),
    async (after) => repo.receivedPage(address, until, after?.id, PAGE))
  for await (const batch of pages) {
    const rows = batch.map((m) => 'sent' in m ? m.sent : m.received)
    const ids = rows.map((row) => row.id)
    const views = await messages.viewMany(rows, address)
    const statuses = await repo.statuses(batch.flatMap((m) => 'sent' in m ? [m.sent.id] : []))
    const metadata = await repo.metadataOf(ids)
    let text = ''
    batch.forEach((m, i) => {
      const row = rows[i]!
      const view = views[i]!
      const line: ExportedMessage = {
        ...view,
        attachments: view.attachments.map((a) => ({ ...a, file: archivePath(row.id, a.index, a.filename) })),
        ...('sent' in m ? { recipients: statuses.get(row.id) ?? [] } : { status: m.received.status }),
        ...(metadata.has(row.id) ? { metadata: metadata.get(row.id)! } : {})
      }
      text += JSON.stringify(line) + '\n'
    })
    yield text
    await giveTheLoopATurn()
  }
}

/**
 * The files of every message the export lists, in the same order, the messages read again page
 * by page: their places only (no body read or opened a second time, and a page held across a
 * file's whole download is a few kilobytes).
 */
async function * filesOf (repo: ExportRepository, address: string, until: Date) {
  const pages = readableMessages<MessagePlace, MessagePlace>(
    async (after) => repo.sentPlaces(address, until, after, PAGE),
    async (after) => repo.receivedPlaces(address, until, after?.id, PAGE))
  for await (const batch of pages) {
    const places = batch.map((m) => 'sent' in m ? m.sent : m.received)
    const created = new Map(places.map((m) => [m.id, m.createdAt]))
    for (const file of await repo.files(places.map((m) => m.id))) {
      yield { ...file, path: archivePath(file.messageId, file.n, file.filename), createdAt: created.get(file.messageId)! }
    }
    // A user of many messages and few files: pages read one after another, with nothing written.
    await giveTheLoopATurn()
  }
}

/**
 * A stored file's bytes, a chunk at a time as the archive takes them (`first`, chunk 0, read
 * already): each chunk read and opened whole, in pieces of at most 64 KiB
 * (attachment-chunks.repository.ts, readChunk: one binary COPY); a file
 * whose rows are gone meanwhile (the embedded database reads no snapshot) fails the export
 * rather than end short in silence.
 */
async function * fileBytes (chunks: ReturnType<typeof createAttachmentChunksRepository>, uploadId: string, size: number, first: Buffer[]): AsyncGenerator<Buffer> {
  for (let seq = 0, at = 0; at < size; seq++) {
    const length = Math.min(CHUNK_BYTES, size - at)
    const chunk = seq === 0 ? first : await chunks.readChunk(uploadId, seq)
    if (chunk === undefined || piecesLength(chunk) !== length) throw new Error(`attachment ${uploadId} lost bytes ${at}..${at + length} during the export`)
    yield * chunk
    at += length
    await giveTheLoopATurn()
  }
}
