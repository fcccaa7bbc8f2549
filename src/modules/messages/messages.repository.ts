import { and, asc, eq, inArray, isNull, sql } from 'drizzle-orm'
import type { Db } from '../../db/client.js'
import { queryRows } from '../../db/rows.js'
import type { Message } from './messages.schemas.js'
import { attachments, deliveries, messages, type DeliveryStatus, type MessageRow } from './messages.table.js'

const RANK: Record<DeliveryStatus, number> = { sent: 0, delivered: 1, read: 2 }

type AttachmentMeta = Message['attachments'][number]

/** What the wire form of a message is made from: a stored row, or any query's equivalent. */
export type MessageFields = Pick<MessageRow, 'id' | 'sender' | 'recipient' | 'body' | 'createdAt' | 'editedAt' | 'replyTo'>

function toMessage (row: MessageFields, files: AttachmentMeta[]): Message {
  return {
    id: row.id,
    sender: row.sender,
    recipient: row.recipient,
    body: row.body,
    attachments: files,
    createdAt: row.createdAt.toISOString(),
    editedAt: row.editedAt === null ? null : row.editedAt.toISOString(),
    replyTo: row.replyTo
  }
}

export function createMessagesRepository (db: Db) {
  /** Wire forms of many stored messages, their attachments read in one query. */
  async function viewMany (rows: MessageFields[]): Promise<Message[]> {
    if (rows.length === 0) return []
    const files = await db.select({ messageId: attachments.messageId, index: attachments.n, filename: attachments.filename, contentType: attachments.contentType, size: attachments.size })
      .from(attachments).where(inArray(attachments.messageId, rows.map((r) => r.id))).orderBy(asc(attachments.messageId), asc(attachments.n))
    return rows.map((row) => toMessage(row, files.filter((f) => f.messageId === row.id).map(({ messageId: _, ...meta }) => meta)))
  }

  return {
    async find (id: string): Promise<MessageRow | undefined> {
      const [row] = await db.select().from(messages).where(eq(messages.id, id))
      return row
    },

    /**
     * The message, its row locked until the caller's transaction ends: `update` by an edit and
     * by its sender's delete, `share` by a recipient's hide, so each waits for an edit in flight
     * and erases the copies of the body that edit wrote.
     */
    async lock (id: string, mode: 'update' | 'share'): Promise<MessageRow | undefined> {
      const [row] = await db.select().from(messages).where(eq(messages.id, id)).for(mode)
      return row
    },

    /**
     * Replaces the body and sets editedAt, if the message was sent less than `windowSeconds`
     * ago by the database's clock; undefined past the window (or when it is gone).
     */
    async edit (id: string, body: string, windowSeconds: number): Promise<MessageRow | undefined> {
      // The time of the edit itself, under the row's lock (not its transaction's start): of
      // racing edits, a later one has a later editedAt.
      const [row] = await db.update(messages).set({ body, editedAt: sql`clock_timestamp()` })
        .where(and(eq(messages.id, id), sql`${messages.createdAt} > now() - make_interval(secs => ${windowSeconds})`))
        .returning()
      return row
    },

    /** The recipients that still have the message (not hidden), in address order. */
    async readers (id: string): Promise<string[]> {
      const rows = await db.select({ recipient: deliveries.recipient }).from(deliveries)
        .where(and(eq(deliveries.messageId, id), isNull(deliveries.hiddenAt))).orderBy(asc(deliveries.recipient))
      return rows.map((r) => r.recipient)
    },

    /** The wire form of a stored message, attachments listed without their bytes. */
    async view (row: MessageFields): Promise<Message> {
      const [message] = await viewMany([row])
      return message!
    },

    viewMany,

    async attachment (messageId: string, n: number) {
      const [row] = await db.select().from(attachments).where(and(eq(attachments.messageId, messageId), eq(attachments.n, n)))
      return row
    },

    async delivery (messageId: string, recipient: string) {
      const [row] = await db.select().from(deliveries).where(and(eq(deliveries.messageId, messageId), eq(deliveries.recipient, recipient)))
      return row
    },

    async deliveries (messageId: string) {
      return db.select().from(deliveries).where(eq(deliveries.messageId, messageId)).orderBy(asc(deliveries.recipient))
    },

    /**
     * Erases the message for everyone: its row, files and delivery rows go (files by cascade,
     * deliveries by trigger: migration 0013).
     * Answers the recipients it had, or undefined when it was already gone: of racing
     * deletes, only the one that removed the row gets them (the others wait on its row lock,
     * then find nothing to delete).
     */
    async remove (id: string): Promise<string[] | undefined> {
      const [row] = await queryRows<{ recipients: string[] | null }>(db, sql`
        WITH gone AS (DELETE FROM ${messages} WHERE ${messages.id} = ${id} RETURNING id)
        SELECT array(SELECT ${deliveries.recipient} FROM ${deliveries} WHERE ${deliveries.messageId} IN (SELECT id FROM gone) ORDER BY 1) AS recipients
        WHERE EXISTS (SELECT 1 FROM gone)`)
      return row === undefined ? undefined : row.recipients ?? []
    },

    /** Hides the message from one recipient only. */
    async hide (id: string, recipient: string): Promise<void> {
      await db.update(deliveries).set({ hiddenAt: sql`now()` })
        .where(and(eq(deliveries.messageId, id), eq(deliveries.recipient, recipient)))
    },

    /**
     * Moves a recipient's status forward (read implies delivered); a report that is not ahead
     * changes nothing. Returns true when it changed.
     */
    async advance (messageId: string, recipient: string, status: DeliveryStatus): Promise<boolean> {
      const changed = await db.update(deliveries).set({ status, updatedAt: sql`now()` })
        .where(and(
          eq(deliveries.messageId, messageId),
          eq(deliveries.recipient, recipient),
          inArray(deliveries.status, (Object.keys(RANK) as DeliveryStatus[]).filter((s) => RANK[s] < RANK[status]))
        ))
        .returning({ status: deliveries.status })
      return changed.length > 0
    }
  }
}

export type MessagesRepository = ReturnType<typeof createMessagesRepository>
