import { asc, inArray, sql, type SQL } from 'drizzle-orm'
import type { Db } from '../../db/client.js'
import { queryRows } from '../../db/rows.js'
import { openText, record } from '../../sealing/records.js'
import { messageFieldsOf, type MessageColumns, type MessageFields } from '../messages/messages.repository.js'
import { attachments } from '../messages/messages.table.js'
import { metadataMap } from '../metadata/metadata.repository.js'
import { metadata } from '../metadata/metadata.table.js'

/** Where a page of the user's sent messages starts: after this message (their order is time, then id). */
export interface SentAfter { createdAt: Date, id: string }

/** A message's place in the export's order, without its content (the files' pass reads only this). */
export interface MessagePlace { id: string, createdAt: Date }

/** A message delivered to the user, with the user's own delivery status. */
export type ReceivedFields = MessageFields & { status: 'sent' | 'delivered' | 'read' }

/** A message's recipients and their statuses, as GET /message/{id}/status lists them. */
export interface RecipientStatus { address: string, status: 'sent' | 'delivered' | 'read', updatedAt: string }

/** An attachment of a message in the export: its name in the archive and where its bytes are. */
export interface ExportedFile { messageId: string, n: number, filename: string, size: number, uploadId: string }

const asDate = (value: Date | string): Date => value instanceof Date ? value : new Date(value)

const MESSAGE_COLUMNS = sql`m.id, m.sender, m.recipient, m.body, m.sealed_by, m.created_at, m.edited_at, m.reply_to`
const PLACE_COLUMNS = sql`m.id, m.created_at`
interface PlaceColumns { id: string, created_at: Date | string }
const placeOf = (row: PlaceColumns): MessagePlace => ({ id: row.id, createdAt: asDate(row.created_at) })

/** An ISO 8601 UTC time with milliseconds, as the API writes them, from SQL. */
const isoText = (column: ReturnType<typeof sql>) => sql`to_char(${column} AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')`

/**
 * What an export reads, a page at a time, each page a short statement that an index serves: the
 * user's sent messages by (sender, created_at), the messages delivered to it by (recipient,
 * message_id). Every read is bounded by `until`, the export's start, so on the embedded database
 * (no snapshot: db/snapshot.ts) what arrives meanwhile is left out.
 */
export function createExportRepository (db: Db) {
  /** A page of the messages `address` sent, by (created_at, id). */
  const sent = async <T>(columns: SQL, address: string, until: Date, after: SentAfter | undefined, limit: number) => queryRows<T>(db, sql`
    SELECT ${columns} FROM messages m
    WHERE m.sender = ${address} AND m.created_at <= ${until.toISOString()}::timestamptz
      AND ${after === undefined ? sql`TRUE` : sql`(m.created_at, m.id) > (${after.createdAt.toISOString()}::timestamptz, ${after.id})`}
    ORDER BY m.created_at, m.id LIMIT ${limit}`)
  /** A page of the messages delivered to `address` by others and not hidden, by message id. */
  const received = async <T>(columns: SQL, address: string, until: Date, afterId: string | undefined, limit: number) => queryRows<T>(db, sql`
    SELECT ${columns} FROM deliveries d JOIN messages m ON m.id = d.message_id
    WHERE d.recipient = ${address} AND d.hidden_at IS NULL AND m.sender <> ${address}
      AND m.created_at <= ${until.toISOString()}::timestamptz
      AND ${afterId === undefined ? sql`TRUE` : sql`d.message_id > ${afterId}`}
    ORDER BY d.message_id LIMIT ${limit}`)
  return {
    /** The database's time: in a snapshot, its start. */
    async now (): Promise<Date> {
      const [row] = await queryRows<{ now: Date | string }>(db, sql`SELECT now() AS now`)
      return asDate(row!.now)
    },

    /**
     * Takes the cluster-wide lock that lets one export of `address` run at a time, for as long as
     * the snapshot's transaction: false when another instance holds it.
     */
    async tryLock (address: string): Promise<boolean> {
      const [row] = await queryRows<{ locked: boolean }>(db, sql`SELECT pg_try_advisory_xact_lock(hashtextextended('parley-export:' || ${address}, 0)) AS locked`)
      return row?.locked === true
    },

    async sentPage (address: string, until: Date, after: SentAfter | undefined, limit: number): Promise<MessageFields[]> {
      return (await sent<MessageColumns>(MESSAGE_COLUMNS, address, until, after, limit)).map(messageFieldsOf)
    },

    /** sentPage's messages, their places only: no body read, none opened. */
    async sentPlaces (address: string, until: Date, after: SentAfter | undefined, limit: number): Promise<MessagePlace[]> {
      return (await sent<PlaceColumns>(PLACE_COLUMNS, address, until, after, limit)).map(placeOf)
    },

    /** Delivered to `address` by others and not hidden, in message-id order. */
    async receivedPage (address: string, until: Date, afterId: string | undefined, limit: number): Promise<ReceivedFields[]> {
      const rows = await received<MessageColumns & { status: ReceivedFields['status'] }>(sql`${MESSAGE_COLUMNS}, d.status`, address, until, afterId, limit)
      return rows.map((row) => ({ ...messageFieldsOf(row), status: row.status }))
    },

    /** receivedPage's messages, their places only. */
    async receivedPlaces (address: string, until: Date, afterId: string | undefined, limit: number): Promise<MessagePlace[]> {
      return (await received<PlaceColumns>(PLACE_COLUMNS, address, until, afterId, limit)).map(placeOf)
    },

    /** Each message's recipients and statuses, one JSON list per message (aggregated in SQL: a group's 1,000 rows are one value). */
    async statuses (messageIds: string[]): Promise<Map<string, RecipientStatus[]>> {
      if (messageIds.length === 0) return new Map()
      const rows = await queryRows<{ message_id: string, recipients: string }>(db, sql`
        SELECT message_id, json_agg(json_build_object('address', recipient, 'status', status, 'updatedAt', ${isoText(sql`updated_at`)})
          ORDER BY recipient)::text AS recipients
        FROM deliveries WHERE message_id = ANY(${sql.param(messageIds)}::text[]) GROUP BY message_id`)
      return new Map(rows.map((r) => [r.message_id, JSON.parse(r.recipients) as RecipientStatus[]]))
    },

    /** The metadata of these entities (messages, groups) that have any: opened here, so empty maps are left out here too. */
    async metadataOf (entities: string[]): Promise<Map<string, Record<string, unknown>>> {
      if (entities.length === 0) return new Map()
      const rows = await db.select().from(metadata).where(inArray(metadata.entity, entities))
      const maps = rows.map((row) => [row.entity, metadataMap(row)] as const)
      return new Map(maps.filter(([, map]) => Object.keys(map).length > 0))
    },

    /** The files of these messages, in message and upload order, their names opened. */
    async files (messageIds: string[]): Promise<ExportedFile[]> {
      if (messageIds.length === 0) return []
      const rows = await db.select({ messageId: attachments.messageId, n: attachments.n, filename: attachments.filename, size: attachments.size, uploadId: attachments.uploadId, sealedBy: attachments.sealedBy })
        .from(attachments).where(inArray(attachments.messageId, messageIds)).orderBy(asc(attachments.messageId), asc(attachments.n))
      return rows.map(({ sealedBy, ...file }) => ({ ...file, filename: openText(file.filename, record.attachmentFilename(file.messageId, file.n), sealedBy) }))
    },

    /** Groups `address` is a member of (or owns), by id after `afterId`. */
    async groupIds (address: string, afterId: string | undefined, limit: number): Promise<string[]> {
      const rows = await queryRows<{ id: string }>(db, sql`
        SELECT id FROM (
          SELECT group_id AS id FROM group_members WHERE address = ${address}
          UNION SELECT id FROM groups WHERE owner = ${address}
        ) mine WHERE ${afterId === undefined ? sql`TRUE` : sql`id > ${afterId}`} ORDER BY id LIMIT ${limit}`)
      return rows.map((r) => r.id)
    },

    /** When `address` joined each of these groups. */
    async joinedAt (address: string, groupIds: string[]): Promise<Map<string, string>> {
      if (groupIds.length === 0) return new Map()
      const rows = await queryRows<{ group_id: string, at: string }>(db, sql`
        SELECT group_id, ${isoText(sql`added_at`)} AS at FROM group_members
        WHERE address = ${address} AND group_id = ANY(${sql.param(groupIds)}::text[])`)
      return new Map(rows.map((r) => [r.group_id, r.at]))
    }
  }
}

export type ExportRepository = ReturnType<typeof createExportRepository>
