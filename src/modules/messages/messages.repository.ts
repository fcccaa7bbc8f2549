import { and, asc, eq, inArray, isNull, sql } from 'drizzle-orm'
import type { Db } from '../../db/client.js'
import { dateOf, dateOrNull, queryRows, type DriverTime } from '../../db/rows.js'
import { openText, record } from '../../sealing/records.js'
import type { Message } from './messages.schemas.js'
import { openedBody, storedBody } from './message-body.js'
import { attachments, deliveries, messageColumns, messageReactions, messages, type AttachmentRow, type DeliveryStatus, type MessageRow } from './messages.table.js'

const RANK: Record<DeliveryStatus, number> = { sent: 0, delivered: 1, read: 2 }

type AttachmentMeta = Message['attachments'][number]

/** What the wire form of a message is made from: a stored row, or any query's equivalent. */
export type MessageFields = Pick<MessageRow, 'id' | 'sender' | 'recipient' | 'body' | 'createdAt' | 'editedAt' | 'replyTo'>

type Reaction = Message['reactions'][number]

/** A message's columns as raw SQL answers them (a driver may give a time as text). */
export interface MessageColumns {
  id: string
  sender: string
  recipient: string
  /** As stored: sealed under sealed_by's key, or plain when that is null. */
  body: string
  sealed_by: string | null
  created_at: DriverTime
  edited_at: DriverTime | null
  reply_to: string | null
}

/** The fields of a message read by raw SQL (history pages, exports), its body opened. */
export function messageFieldsOf (r: MessageColumns): MessageFields {
  return {
    id: r.id,
    sender: r.sender,
    recipient: r.recipient,
    body: openedBody({ id: r.id, body: r.body, sealedBy: r.sealed_by }),
    createdAt: dateOf(r.created_at),
    editedAt: dateOrNull(r.edited_at),
    replyTo: r.reply_to
  }
}

/** A stored row with its body opened: what every reader of the repository gets. */
export function opened (row: MessageRow): MessageRow {
  return { ...row, body: openedBody(row) }
}

/** An attachment's columns that are sealed (API.md §11), as written (sealedBy NULL: plain). */
type SealedAttachmentColumns = Pick<AttachmentRow, 'messageId' | 'n' | 'filename' | 'contentType' | 'sealedBy'>

/** An attachment as a message lists it, its name and type opened. */
function attachmentMeta (row: SealedAttachmentColumns & Pick<AttachmentRow, 'size'>): AttachmentMeta {
  return {
    index: row.n,
    filename: openText(row.filename, record.attachmentFilename(row.messageId, row.n), row.sealedBy),
    contentType: openText(row.contentType, record.attachmentContentType(row.messageId, row.n), row.sealedBy),
    size: row.size
  }
}

/** A stored attachment row with its name, type and hash opened (a download's headers, its ETag). */
function openAttachment (row: AttachmentRow): AttachmentRow {
  const { filename, contentType } = attachmentMeta(row)
  return { ...row, filename, contentType, sha256: openText(row.sha256, record.attachmentSha256(row.messageId, row.n), row.sealedBy) }
}

function toMessage (row: MessageFields, files: AttachmentMeta[], reactions: Reaction[]): Message {
  return {
    id: row.id,
    sender: row.sender,
    recipient: row.recipient,
    body: row.body,
    attachments: files,
    createdAt: row.createdAt.toISOString(),
    editedAt: row.editedAt === null ? null : row.editedAt.toISOString(),
    replyTo: row.replyTo,
    reactions
  }
}

export function createMessagesRepository (db: Db) {
  /**
   * Wire forms of many stored messages as `viewer` sees them (its own reactions are `mine`):
   * their attachments in one query, their reactions counted in another.
   */
  async function viewMany (rows: MessageFields[], viewer: string): Promise<Message[]> {
    if (rows.length === 0) return []
    const ids = rows.map((r) => r.id)
    const files = await db.select({ messageId: attachments.messageId, n: attachments.n, filename: attachments.filename, contentType: attachments.contentType, size: attachments.size, sealedBy: attachments.sealedBy })
      .from(attachments).where(inArray(attachments.messageId, ids)).orderBy(asc(attachments.messageId), asc(attachments.n))
    const counted = await reactionsOf(ids, [viewer])
    return rows.map((row) => toMessage(row, files.filter((f) => f.messageId === row.id).map(attachmentMeta), counted(row.id, viewer)))
  }

  /**
   * The reactions of these messages, counted once; `(id, reader)` answers one message's as
   * `reader` (one of `readers`) sees them: most used first, then first used first.
   */
  async function reactionsOf (ids: string[], readers: string[]): Promise<(id: string, reader: string) => Reaction[]> {
    const rows = await queryRows<{ message_id: string, emoji: string, count: number, first: string, readers: string[] }>(db, sql`
      SELECT message_id, emoji, count(*)::int AS count, min(created_at)::text AS first,
        array_agg(address) FILTER (WHERE address = ANY(${sql.param(readers)}::text[])) AS readers
      FROM ${messageReactions} WHERE message_id = ANY(${sql.param(ids)}::text[])
      GROUP BY message_id, emoji ORDER BY message_id, count(*) DESC, min(created_at), emoji`)
    const byMessage = new Map<string, typeof rows>()
    for (const r of rows) byMessage.set(r.message_id, [...(byMessage.get(r.message_id) ?? []), r])
    return (id, reader) => (byMessage.get(id) ?? []).map((r) => ({ emoji: r.emoji, count: r.count, mine: (r.readers ?? []).includes(reader) }))
  }

  return {
    async find (id: string): Promise<MessageRow | undefined> {
      const [row] = await db.select(messageColumns).from(messages).where(eq(messages.id, id))
      return row === undefined ? undefined : opened(row)
    },

    /**
     * The message, its row locked until the caller's transaction ends: `update` by an edit and
     * by its sender's delete, `share` by a recipient's hide, so each waits for an edit in flight
     * and erases the copies of the body that edit wrote; `no key update` by a reaction.
     */
    async lock (id: string, mode: 'update' | 'no key update' | 'share'): Promise<MessageRow | undefined> {
      const [row] = await db.select(messageColumns).from(messages).where(eq(messages.id, id)).for(mode)
      return row === undefined ? undefined : opened(row)
    },

    /**
     * Replaces the body and sets editedAt, if the message was sent less than `windowSeconds`
     * ago by the database's clock; undefined past the window (or when it is gone).
     */
    async edit (id: string, body: string, windowSeconds: number): Promise<MessageRow | undefined> {
      // The time of the edit itself, under the row's lock (not its transaction's start): of
      // racing edits, a later one has a later editedAt.
      const [row] = await db.update(messages).set({ ...storedBody(id, body), editedAt: sql`clock_timestamp()` })
        .where(and(eq(messages.id, id), sql`${messages.createdAt} > now() - make_interval(secs => ${windowSeconds})`))
        .returning(messageColumns)
      return row === undefined ? undefined : { ...row, body }
    },

    /** How many different emoji the message carries, and whether `emoji` is one of them. */
    async reactionKinds (id: string, emoji: string): Promise<{ distinct: number, has: boolean }> {
      const [row] = await queryRows<{ distinct: number, has: boolean }>(db, sql`
        SELECT count(DISTINCT emoji)::int AS distinct, coalesce(bool_or(emoji = ${emoji}), false) AS has
        FROM ${messageReactions} WHERE message_id = ${id}`)
      return row!
    },

    /** Adds `address`'s reaction; false when it was there already. */
    async addReaction (id: string, emoji: string, address: string): Promise<boolean> {
      const added = await db.insert(messageReactions).values({ messageId: id, emoji, address }).onConflictDoNothing()
        .returning({ emoji: messageReactions.emoji })
      return added.length > 0
    },

    /** Removes `address`'s reaction; false when there was none. */
    async removeReaction (id: string, emoji: string, address: string): Promise<boolean> {
      const removed = await db.delete(messageReactions)
        .where(and(eq(messageReactions.messageId, id), eq(messageReactions.emoji, emoji), eq(messageReactions.address, address)))
        .returning({ emoji: messageReactions.emoji })
      return removed.length > 0
    },

    /** The recipients that still have the message (not hidden), in address order; the first `limit` of them if given. */
    async readers (id: string, limit?: number): Promise<string[]> {
      const all = db.select({ recipient: deliveries.recipient }).from(deliveries)
        .where(and(eq(deliveries.messageId, id), isNull(deliveries.hiddenAt))).orderBy(asc(deliveries.recipient))
      const rows = await (limit === undefined ? all : all.limit(limit))
      return rows.map((r) => r.recipient)
    },

    /** The wire form of a stored message as `viewer` sees it, attachments listed without their bytes. */
    async view (row: MessageFields, viewer: string): Promise<Message> {
      const [message] = await viewMany([row], viewer)
      return message!
    },

    viewMany,

    /** One stored message as each of `readers` sees it (its reactions' `mine` is each one's own): for events. */
    async viewFor (row: MessageFields, readers: string[]): Promise<Map<string, Message>> {
      const [base] = await viewMany([row], '')
      const counted = await reactionsOf([row.id], readers)
      return new Map(readers.map((reader) => [reader, { ...base!, reactions: counted(row.id, reader) }]))
    },

    /** One attachment's row, its name, type and hash opened; undefined when there is none. */
    async attachment (messageId: string, n: number): Promise<AttachmentRow | undefined> {
      const [row] = await db.select().from(attachments).where(and(eq(attachments.messageId, messageId), eq(attachments.n, n)))
      return row === undefined ? undefined : openAttachment(row)
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

    /**
     * Retention: up to `limit` messages past the retention that applies to them, oldest first
     * (`days`, MESSAGE_RETENTION_DAYS, for every message; a group's own retention_days for its
     * messages when shorter), each locked until the caller's transaction ends. One locked by
     * other work (an edit, a delete, a reaction) is left for a later batch, not waited for.
     * Each part reads an index from its oldest end (messages_age_idx; a group's recipient and
     * created_at), so a batch costs its own size, not the table's.
     */
    async lockExpired (days: number | undefined, limit: number): Promise<string[]> {
      // messages_age_idx's expression (messages.table.ts): the purge's own index, from its oldest end.
      const age = sql`(m.created_at AT TIME ZONE 'UTC')`
      const byService = days === undefined
        ? sql`SELECT NULL::text AS id WHERE false`
        : sql`SELECT m.id FROM ${messages} m WHERE ${age} < (now() AT TIME ZONE 'UTC') - make_interval(days => ${days})
          ORDER BY ${age} LIMIT ${limit}`
      const byGroup = sql`SELECT old.id FROM groups g CROSS JOIN LATERAL (
          SELECT m.id FROM ${messages} m WHERE m.recipient = g.id AND m.created_at < now() - make_interval(days => g.retention_days)
          ORDER BY m.created_at LIMIT ${limit}) old
        WHERE g.retention_days IS NOT NULL${days === undefined ? sql`` : sql` AND g.retention_days < ${days}`}
        LIMIT ${limit}`
      const rows = await queryRows<{ id: string }>(db, sql`
        SELECT id FROM ${messages} WHERE id IN ((${byService}) UNION ALL (${byGroup}))
        LIMIT ${limit} FOR UPDATE SKIP LOCKED`)
      return rows.map((r) => r.id)
    },

    /**
     * Erases these messages for everyone, as remove() does one: rows, files, reactions (by
     * cascade), delivery rows (by trigger) and search entries (their own column) go. Answers how
     * many were there to delete.
     */
    async removeMany (ids: string[]): Promise<number> {
      if (ids.length === 0) return 0
      const gone = await db.delete(messages).where(sql`${messages.id} = ANY(${sql.param(ids)}::text[])`).returning({ id: messages.id })
      return gone.length
    },

    /**
     * Erasure: the oldest messages `sender` sent, at most `limit`, and fewer when together they
     * had more than `maxRecipients` recipients (always at least one), each locked until the
     * caller's transaction ends (waiting for an edit or a reaction in flight), in id order.
     */
    async lockSentBy (sender: string, limit: number, maxRecipients: number): Promise<string[]> {
      const rows = await queryRows<{ id: string }>(db, sql`
        SELECT id FROM ${messages} WHERE id IN (
          SELECT id FROM (
            SELECT m.id, row_number() OVER w AS n, sum(m.recipients) OVER w AS recipients
            FROM (
              SELECT o.id, o.created_at, (SELECT count(*) FROM ${deliveries} d WHERE d.message_id = o.id) AS recipients
              FROM ${messages} o WHERE o.sender = ${sender} ORDER BY o.created_at LIMIT ${limit}
            ) m
            WINDOW w AS (ORDER BY m.created_at, m.id)
          ) counted WHERE n = 1 OR recipients <= ${maxRecipients})
        ORDER BY id FOR UPDATE`)
      return rows.map((r) => r.id)
    },

    /**
     * Erases these messages for everyone, as remove() does one, and answers each message's
     * recipients (every delivery row it had) for their message.deleted.
     */
    async removeManyTelling (ids: string[]): Promise<{ messageId: string, recipient: string }[]> {
      if (ids.length === 0) return []
      const rows = await queryRows<{ message_id: string, recipient: string }>(db, sql`
        WITH gone AS (DELETE FROM ${messages} WHERE ${messages.id} = ANY(${sql.param(ids)}::text[]) RETURNING id)
        SELECT ${deliveries.messageId}, ${deliveries.recipient} FROM ${deliveries} WHERE ${deliveries.messageId} IN (SELECT id FROM gone)
        ORDER BY 2, 1`)
      return rows.map((r) => ({ messageId: r.message_id, recipient: r.recipient }))
    },

    /**
     * Erasure: up to `limit` of `address`'s reactions to others' messages, removed, the messages
     * locked first (no key update, as a reaction locks its message), in id order. Answers the
     * messages they were on.
     */
    async removeReactionsBy (address: string, limit: number): Promise<string[]> {
      const picked = await db.selectDistinct({ messageId: messageReactions.messageId }).from(messageReactions)
        .where(eq(messageReactions.address, address)).orderBy(asc(messageReactions.messageId)).limit(limit)
      if (picked.length === 0) return []
      const ids = picked.map((r) => r.messageId)
      await db.select({ id: messages.id }).from(messages).where(inArray(messages.id, ids)).orderBy(asc(messages.id)).for('no key update')
      await db.delete(messageReactions).where(and(eq(messageReactions.address, address), inArray(messageReactions.messageId, ids)))
      return ids
    },

    /**
     * Erasure: up to `limit` of `recipient`'s delivery rows (its statuses and hides of messages
     * others sent it); the messages stay their senders'. Answers how many went.
     */
    async removeDeliveriesOf (recipient: string, limit: number): Promise<number> {
      const some = db.select({ messageId: deliveries.messageId }).from(deliveries)
        .where(eq(deliveries.recipient, recipient)).orderBy(asc(deliveries.messageId)).limit(limit)
      const gone = await db.delete(deliveries).where(and(eq(deliveries.recipient, recipient), inArray(deliveries.messageId, some)))
        .returning({ messageId: deliveries.messageId })
      return gone.length
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
