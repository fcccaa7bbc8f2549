import { sql } from 'drizzle-orm'
import type { Db } from '../../db/client.js'
import { queryRows } from '../../db/rows.js'
import type { MessageFields } from '../messages/messages.repository.js'
import type { Message } from '../messages/messages.schemas.js'
import type { Conversation } from './conversations.schemas.js'

export interface ConversationRow {
  peer: string
  /** The newest message the caller may read in this conversation. */
  last: MessageFields
  unread: number
}

/** Where a page stopped: the last conversation's newest message. */
export interface ConversationsAfter { createdAt: string, id: string }

/** A conversation's wire form: its row, with the wire form of its newest message. */
export function toConversation (row: ConversationRow, lastMessage: Message): Conversation {
  return { peer: row.peer, type: row.peer.startsWith('grp_') ? 'group' : 'user', lastMessage, unread: row.unread }
}

interface Row {
  peer: string
  unread: string | number
  id: string
  sender: string
  recipient: string
  body: string
  created_at: Date | string
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
        SELECT latest.peer, counts.unread, m.id, m.sender, m.recipient, m.body, m.created_at
        FROM latest
        JOIN counts ON counts.peer = latest.peer
        JOIN messages m ON m.id = latest.id
        WHERE ${after === undefined ? sql`TRUE` : sql`(latest.created_at, latest.id) < (${after.createdAt}::timestamptz, ${after.id})`}
        ORDER BY latest.created_at DESC, latest.id DESC
        LIMIT ${limit}`)
      return rows.map((r) => ({
        peer: r.peer,
        unread: Number(r.unread),
        last: {
          id: r.id,
          sender: r.sender,
          recipient: r.recipient,
          body: r.body,
          createdAt: r.created_at instanceof Date ? r.created_at : new Date(r.created_at)
        }
      }))
    }
  }
}
