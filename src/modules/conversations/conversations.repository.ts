import { sql, type SQL } from 'drizzle-orm'
import type { Db } from '../../db/client.js'
import { queryRows } from '../../db/rows.js'
import { messageFieldsOf, type MessageColumns, type MessageFields } from '../messages/messages.repository.js'
import type { Message } from '../messages/messages.schemas.js'
import type { Conversation } from './conversations.schemas.js'

export interface ConversationRow {
  peer: string
  /** The newest message the caller may read in this conversation. */
  last: MessageFields
  unread: number
}

/** Which way a history page runs from its `from`: `back` newest first, `forward` oldest first. */
type HistoryDirection = 'back' | 'forward'

export interface HistoryPage {
  /** Start after this message id in the page's direction; none starts at the newest (back) or oldest (forward). */
  from: string | undefined
  dir: HistoryDirection
  limit: number
  /** In a group: the least id of others' messages that can have reached the viewer (deliveredSince). */
  since?: string | undefined
}

/** Where a page stopped: the last conversation's newest message. */
export interface ConversationsAfter { createdAt: string, id: string }

/** A conversation's wire form: its row, with the wire form of its newest message. */
export function toConversation (row: ConversationRow, lastMessage: Message): Conversation {
  return { peer: row.peer, type: row.peer.startsWith('grp_') ? 'group' : 'user', lastMessage, unread: row.unread }
}

interface Row extends MessageColumns {
  peer: string
  unread: string | number
}

/**
 * One page of the conversation between `viewer` and `peer` (a user's address or a group id), of
 * what the viewer may read: the messages it sent there, and those delivered to it there that it
 * did not hide. In message-id order (ids are time-ordered and never reused, so a page may start
 * at a message deleted since). Each half is an index run (messages_conversation_idx,
 * messages_group_history_idx) cut at `limit`: a page reads what it shows plus the messages of
 * others it skips (hidden, or in a group from before the viewer's time in it), whatever the
 * conversation's length.
 */
export function historyStatement (viewer: string, peer: string, page: HistoryPage): SQL {
  const back = page.dir === 'back'
  const order = back ? sql`DESC` : sql`ASC`
  const beyond = back ? sql`<` : sql`>`
  // The position twice: as the id bound the index scan starts at (after the equalities on its
  // leading columns), and as a row of the index's own columns, which only that index can
  // evaluate, so the planner does not trade it for the primary key filtered row by row.
  const past = (columns: SQL, values: SQL) => page.from === undefined
    ? sql`TRUE`
    : sql`m.id ${beyond} ${page.from} AND (${columns}) ${beyond} (${values}, ${page.from})`
  // Looked up per message (a subquery, not a join the planner could turn into a merge over every
  // delivery of the viewer's).
  const delivered = sql`(SELECT d.hidden_at IS NULL FROM deliveries d WHERE d.message_id = m.id AND d.recipient = ${viewer})`
  const mine = sql`m.sender = ${viewer} AND m.recipient = ${peer} AND ${past(sql`m.sender, m.recipient, m.id`, sql`${viewer}, ${peer}`)}`
  // Theirs: a group's messages from its other members (the literal LIKE lets the partial index
  // serve), or the peer's to the viewer; none apart from its own when talking to itself.
  const theirs = peer.startsWith('grp_')
    ? sql`m.recipient = ${peer} AND m.recipient LIKE 'grp\\_%' AND m.sender <> ${viewer} AND ${past(sql`m.recipient, m.id`, sql`${peer}`)}
        AND ${page.since === undefined ? sql`TRUE` : sql`m.id >= ${page.since}`}`
    : peer === viewer
      ? sql`FALSE`
      : sql`m.sender = ${peer} AND m.recipient = ${viewer} AND ${past(sql`m.sender, m.recipient, m.id`, sql`${peer}, ${viewer}`)}`
  return sql`
    SELECT * FROM (
      (SELECT m.id, m.sender, m.recipient, m.body, m.sealed_by, m.created_at, m.edited_at, m.reply_to FROM messages m
       WHERE ${mine} ORDER BY m.id ${order} LIMIT ${page.limit})
      UNION ALL
      (SELECT m.id, m.sender, m.recipient, m.body, m.sealed_by, m.created_at, m.edited_at, m.reply_to FROM messages m
       WHERE ${theirs} AND ${delivered} ORDER BY m.id ${order} LIMIT ${page.limit})
    ) page ORDER BY id ${order} LIMIT ${page.limit}`
}

/**
 * The conversations of one user, from what it may read: messages it sent (not a group's, once it
 * left), and messages delivered to it that it did not hide. A message's conversation is its
 * group, or the other party of a 1:1 message. Cost follows the caller's own messages (both
 * halves start from indexes on the caller: messages by sender, deliveries by recipient), never
 * the whole table.
 */
export function createConversationsRepository (db: Db) {
  return {
    async list (viewer: string, after: ConversationsAfter | undefined, limit: number): Promise<ConversationRow[]> {
      const rows = await queryRows<Row>(db, sql`
        WITH mine AS (
          SELECT m.id, m.created_at, m.recipient AS peer, FALSE AS unread
          FROM messages m WHERE m.sender = ${viewer}
          UNION ALL
          SELECT m.id, m.created_at,
            CASE WHEN m.recipient LIKE 'grp\\_%' THEN m.recipient ELSE m.sender END AS peer,
            d.status <> 'read' AND m.sender <> ${viewer} AS unread
          FROM deliveries d JOIN messages m ON m.id = d.message_id
          WHERE d.recipient = ${viewer} AND d.hidden_at IS NULL
        ),
        current AS (
          SELECT * FROM mine
          WHERE peer NOT LIKE 'grp\\_%'
            OR EXISTS (SELECT 1 FROM group_members gm WHERE gm.group_id = mine.peer AND gm.address = ${viewer})
        ),
        latest AS (
          SELECT DISTINCT ON (peer) peer, id, created_at FROM current ORDER BY peer, created_at DESC, id DESC
        ),
        counts AS (
          SELECT peer, count(*) FILTER (WHERE unread) AS unread FROM current GROUP BY peer
        )
        SELECT latest.peer, counts.unread, m.id, m.sender, m.recipient, m.body, m.sealed_by, m.created_at, m.edited_at, m.reply_to
        FROM latest
        JOIN counts ON counts.peer = latest.peer
        JOIN messages m ON m.id = latest.id
        WHERE ${after === undefined ? sql`TRUE` : sql`(latest.created_at, latest.id) < (${after.createdAt}::timestamptz, ${after.id})`}
        ORDER BY latest.created_at DESC, latest.id DESC
        LIMIT ${limit}`)
      return rows.map((r) => ({ peer: r.peer, unread: Number(r.unread), last: messageFieldsOf(r) }))
    },

    /**
     * Marks read, for `viewer`, every message from others in its conversation with `peer` up to
     * and including `upTo` (in id order) that is not read yet, in one statement: the viewer's
     * unread deliveries (deliveries_unread_idx) locked in id order, then moved to read. Answers
     * each sender that had any.
     */
    async markRead (viewer: string, peer: string, upTo: string): Promise<string[]> {
      const conversation = peer.startsWith('grp_') ? sql`m.recipient = ${peer}` : sql`m.sender = ${peer} AND m.recipient = ${viewer}`
      const rows = await queryRows<{ sender: string }>(db, sql`
        WITH target AS (
          SELECT d.message_id, m.sender FROM deliveries d JOIN messages m ON m.id = d.message_id
          WHERE d.recipient = ${viewer} AND d.status <> 'read' AND d.hidden_at IS NULL AND d.message_id <= ${upTo}
            AND ${conversation} AND m.sender <> ${viewer}
          ORDER BY d.message_id FOR UPDATE OF d
        ), updated AS (
          UPDATE deliveries d SET status = 'read', updated_at = now() FROM target
          WHERE d.message_id = target.message_id AND d.recipient = ${viewer}
          RETURNING target.sender
        )
        SELECT DISTINCT sender FROM updated ORDER BY sender`)
      return rows.map((r) => r.sender)
    },

    /** One page of a conversation's history (historyStatement). */
    async history (viewer: string, peer: string, page: HistoryPage): Promise<MessageFields[]> {
      const rows = await queryRows<MessageColumns>(db, historyStatement(viewer, peer, page))
      return rows.map(messageFieldsOf)
    }
  }
}
