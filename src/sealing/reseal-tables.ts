import { sql, type SQL } from 'drizzle-orm'
import type { Db } from '../db/client.js'
import { queryRows } from '../db/rows.js'
import { bodySearchHashes } from './search-terms.js'
import { SEALED_EVENT_TYPES } from '../modules/events/events.repository.js'
import { createAttachmentChunksRepository } from '../modules/messages/attachment-chunks.repository.js'
import { keyring, SealBroken } from './keyring.js'
import { openJson, openText, record, sealJson, sealText } from './records.js'

/**
 * How each table that holds sealed content is re-sealed, one keyset page at a time (the
 * engine is reseal.ts). A page is read, opened and sealed anew in Node, and written back with
 * one statement whose every row is conditional on its `xmin`: a row any other transaction
 * changed since it was read (an edit, a send claiming a chunk, a write by an instance still
 * sealing under the old key) is left to that write, and counted as skipped for the engine's
 * next round. `sealed_by` alone would not do: an edit under the same old key keeps it.
 */

/** A row's place in its table's primary-key order. */
export type Cursor = readonly (string | number)[]

export interface PageOutcome {
  /** Rows sealed under the active key by this page. */
  sealed: number
  /** Rows changed by someone else between the read and the write: for the next round. */
  skipped: number
  /** Records that did not open under their own key: left as they are, named for the report. */
  broken: string[]
  /** Where the next page starts; undefined: the table is done. */
  next: Cursor | undefined
}

export interface SealedTable {
  name: string
  /** The rows of the table that hold sealed content at all (events: those of message types). */
  scope: SQL
  /** The next page of rows after `after` that `pending` (which includes `scope`) selects, re-sealed. */
  page(tx: Db, pending: SQL, after: Cursor | undefined): Promise<PageOutcome>
}

const ROWS_PER_PAGE = 200
/** Chunks are up to 256 KiB each: four a page keeps a page's transaction as short as a page of messages. */
const CHUNKS_PER_PAGE = 4

/** A record that does not open under its key: kept, named; anything else is a real failure. */
function opened<T> (name: string, broken: string[], open: () => T): T | undefined {
  try {
    return open()
  } catch (err) {
    if (!(err instanceof SealBroken)) throw err
    broken.push(name)
    return undefined
  }
}

function outcome (read: number, limit: number, written: number, attempted: number, broken: string[], last: Cursor | undefined): PageOutcome {
  return { sealed: written, skipped: attempted - written, broken, next: read < limit ? undefined : last }
}

const after1 = (column: SQL, after: Cursor | undefined) => after === undefined ? sql`true` : sql`${column} > ${after[0]}`
/** Past a two-column key: the second column's type named, since a row comparison gives its parameters none. */
const after2 = (columns: SQL, second: SQL, after: Cursor | undefined) =>
  after === undefined ? sql`true` : sql`${columns} > (${after[0]}::text, ${after[1]}::${second})`

const messagesTable: SealedTable = {
  name: 'messages',
  scope: sql`true`,
  async page (tx, pending, after) {
    const rows = await queryRows<{ id: string, body: string, sealed_by: string | null, seen: string }>(tx, sql`
      SELECT id, body, sealed_by, xmin::text AS seen FROM messages
      WHERE ${after1(sql`id`, after)} AND ${pending} ORDER BY id LIMIT ${ROWS_PER_PAGE}`)
    const broken: string[] = []
    const ids: string[] = []
    const seen: string[] = []
    const bodies: string[] = []
    const hashes: string[] = []
    for (const row of rows) {
      const name = record.messageBody(row.id)
      const body = opened(name, broken, () => openText(row.body, name, row.sealed_by))
      if (body === undefined) continue
      ids.push(row.id)
      seen.push(row.seen)
      bodies.push(sealText(body, name).sealed)
      // The search hashes are keyed too: re-computed from the words under the new key.
      hashes.push(bodySearchHashes(body))
    }
    const written = ids.length === 0
      ? []
      : await queryRows<{ id: string }>(tx, sql`
      UPDATE messages AS m SET body = u.body, sealed_by = ${keyring().active}, search_hashes = u.hashes::int[]
      FROM unnest(${sql.param(ids)}::text[], ${sql.param(seen)}::text[], ${sql.param(bodies)}::text[], ${sql.param(hashes)}::text[]) AS u(id, seen, body, hashes)
      WHERE m.id = u.id AND m.xmin::text = u.seen
      RETURNING m.id`)
    const last = rows.at(-1)
    return outcome(rows.length, ROWS_PER_PAGE, written.length, ids.length, broken, last === undefined ? undefined : [last.id])
  }
}

const attachmentsTable: SealedTable = {
  name: 'attachments',
  scope: sql`true`,
  async page (tx, pending, after) {
    const rows = await queryRows<{ message_id: string, n: number, filename: string, content_type: string, sha256: string, sealed_by: string | null, seen: string }>(tx, sql`
      SELECT message_id, n, filename, content_type, sha256, sealed_by, xmin::text AS seen FROM attachments
      WHERE ${after2(sql`(message_id, n)`, sql.raw('int'), after)} AND ${pending} ORDER BY message_id, n LIMIT ${ROWS_PER_PAGE}`)
    const broken: string[] = []
    const keys: string[] = []
    const ns: number[] = []
    const seen: string[] = []
    const columns: [string[], string[], string[]] = [[], [], []]
    for (const row of rows) {
      const names = [
        record.attachmentFilename(row.message_id, row.n),
        record.attachmentContentType(row.message_id, row.n),
        record.attachmentSha256(row.message_id, row.n)
      ] as const
      const values = [row.filename, row.content_type, row.sha256]
      const plain = opened(names[0], broken, () => values.map((value, i) => openText(value, names[i]!, row.sealed_by)))
      if (plain === undefined) continue
      keys.push(row.message_id)
      ns.push(row.n)
      seen.push(row.seen)
      plain.forEach((value, i) => columns[i]!.push(sealText(value, names[i]!).sealed))
    }
    const written = keys.length === 0
      ? []
      : await queryRows<{ n: number }>(tx, sql`
      UPDATE attachments AS a SET filename = u.filename, content_type = u.content_type, sha256 = u.sha256, sealed_by = ${keyring().active}
      FROM unnest(${sql.param(keys)}::text[], ${sql.param(ns)}::int[], ${sql.param(seen)}::text[],
        ${sql.param(columns[0])}::text[], ${sql.param(columns[1])}::text[], ${sql.param(columns[2])}::text[]) AS u(message_id, n, seen, filename, content_type, sha256)
      WHERE a.message_id = u.message_id AND a.n = u.n AND a.xmin::text = u.seen
      RETURNING a.n`)
    const last = rows.at(-1)
    return outcome(rows.length, ROWS_PER_PAGE, written.length, keys.length, broken, last === undefined ? undefined : [last.message_id, last.n])
  }
}

const attachmentChunksTable: SealedTable = {
  name: 'attachment_chunks',
  scope: sql`true`,
  async page (tx, pending, after) {
    const rows = await queryRows<{ upload_id: string, seq: number, sealed_by: string | null, seen: string }>(tx, sql`
      SELECT upload_id, seq, sealed_by, xmin::text AS seen FROM attachment_chunks
      WHERE ${after2(sql`(upload_id, seq)`, sql.raw('int'), after)} AND ${pending} ORDER BY upload_id, seq LIMIT ${CHUNKS_PER_PAGE}`)
    const broken: string[] = []
    let attempted = 0
    let written = 0
    const chunks = createAttachmentChunksRepository(tx)
    for (const row of rows) {
      const name = record.attachmentChunk(row.upload_id, row.seq)
      // Read as every reader does (in pieces, opened under its own key, or as it is when plain).
      let pieces: Buffer[] | undefined
      try {
        pieces = await chunks.readChunk(row.upload_id, row.seq)
      } catch (err) {
        if (!(err instanceof SealBroken)) throw err
        broken.push(name)
        continue
      }
      if (pieces === undefined) continue
      const bytes = Buffer.concat(pieces)
      attempted++
      // One row a statement: a page of chunks in one statement would be a megabyte of parameters.
      const done = await queryRows<{ seq: number }>(tx, sql`
        UPDATE attachment_chunks SET data = ${keyring().seal(bytes, name)}::bytea, sealed_by = ${keyring().active}
        WHERE upload_id = ${row.upload_id} AND seq = ${row.seq} AND xmin::text = ${row.seen}
        RETURNING seq`)
      written += done.length
    }
    const last = rows.at(-1)
    return outcome(rows.length, CHUNKS_PER_PAGE, written, attempted, broken, last === undefined ? undefined : [last.upload_id, last.seq])
  }
}

const metadataTable: SealedTable = {
  name: 'metadata',
  scope: sql`true`,
  async page (tx, pending, after) {
    const rows = await queryRows<{ entity: string, data: unknown, sealed_by: string | null, seen: string }>(tx, sql`
      SELECT entity, data, sealed_by, xmin::text AS seen FROM metadata
      WHERE ${after1(sql`entity`, after)} AND ${pending} ORDER BY entity LIMIT ${ROWS_PER_PAGE}`)
    const broken: string[] = []
    const entities: string[] = []
    const seen: string[] = []
    const data: string[] = []
    for (const row of rows) {
      const name = record.metadata(row.entity)
      const map = opened(name, broken, () => openJson<unknown>(row.data, name, row.sealed_by))
      if (map === undefined) continue
      entities.push(row.entity)
      seen.push(row.seen)
      // The jsonb column holds the sealed text as a JSON string.
      data.push(JSON.stringify(sealJson(map, name).sealed))
    }
    const written = entities.length === 0
      ? []
      : await queryRows<{ entity: string }>(tx, sql`
      UPDATE metadata AS m SET data = u.data::jsonb, sealed_by = ${keyring().active}
      FROM unnest(${sql.param(entities)}::text[], ${sql.param(seen)}::text[], ${sql.param(data)}::text[]) AS u(entity, seen, data)
      WHERE m.entity = u.entity AND m.xmin::text = u.seen
      RETURNING m.entity`)
    const last = rows.at(-1)
    return outcome(rows.length, ROWS_PER_PAGE, written.length, entities.length, broken, last === undefined ? undefined : [last.entity])
  }
}

const eventsTable: SealedTable = {
  name: 'events',
  // An event's record is named by its message: one without (none should be) stays as it is.
  scope: sql`type IN (${sql.join(SEALED_EVENT_TYPES.map((type) => sql`${type}`), sql`, `)}) AND message_id IS NOT NULL`,
  async page (tx, pending, after) {
    // seq as text (a bigint past 2^53 would not survive a JS number); ordered by the column, not that text.
    const rows = await queryRows<{ address: string, seq: string, type: string, message_id: string, data: unknown, sealed_by: string | null, seen: string }>(tx, sql`
      SELECT address, seq::text AS seq, type, message_id, data, sealed_by, xmin::text AS seen FROM events AS e
      WHERE ${after2(sql`(e.address, e.seq)`, sql.raw('bigint'), after)} AND ${pending} ORDER BY e.address, e.seq LIMIT ${ROWS_PER_PAGE}`)
    const broken: string[] = []
    const addresses: string[] = []
    const seqs: string[] = []
    const seen: string[] = []
    const data: string[] = []
    for (const row of rows) {
      const name = record.eventData(row.type, row.message_id)
      // As it was written: a plain message.received may still hold the message's createdAt,
      // which sealed ones leave to events.created_at; readers take either.
      const value = opened(name, broken, () => openJson<unknown>(row.data, name, row.sealed_by))
      if (value === undefined) continue
      addresses.push(row.address)
      seqs.push(row.seq)
      seen.push(row.seen)
      data.push(JSON.stringify(sealJson(value, name).sealed))
    }
    const written = addresses.length === 0
      ? []
      : await queryRows<{ seq: string }>(tx, sql`
      UPDATE events AS e SET data = u.data::jsonb, sealed_by = ${keyring().active}
      FROM unnest(${sql.param(addresses)}::text[], ${sql.param(seqs)}::bigint[], ${sql.param(seen)}::text[], ${sql.param(data)}::text[]) AS u(address, seq, seen, data)
      WHERE e.address = u.address AND e.seq = u.seq AND e.xmin::text = u.seen
      RETURNING e.seq`)
    const last = rows.at(-1)
    return outcome(rows.length, ROWS_PER_PAGE, written.length, addresses.length, broken, last === undefined ? undefined : [last.address, last.seq])
  }
}

/** Every table the sealing pass re-seals, in the order it goes through them. */
export const SEALED_TABLES: readonly SealedTable[] = [messagesTable, attachmentsTable, attachmentChunksTable, metadataTable, eventsTable]
