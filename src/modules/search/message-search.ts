import { and, desc, eq, or, sql, type SQL } from 'drizzle-orm'
import type { Db } from '../../db/client.js'
import { deliveries, messages, type MessageRow } from '../messages/messages.table.js'

/**
 * The words of a query as a tsquery that requires each as a word prefix ('hel' finds
 * "Hello"). Only runs of letters and digits survive, so nothing a user types can be read as
 * tsquery syntax. Undefined when the query has no word at all.
 */
export function prefixQuery (text: string): string | undefined {
  const words = text.toLowerCase().match(/[\p{L}\p{N}]+/gu)
  if (words === null) return undefined
  return [...new Set(words)].slice(0, 32).map((w) => `'${w}':*`).join(' & ')
}

export type Conversation =
  | { kind: 'user', address: string }
  | { kind: 'group', id: string }

export interface MessageSearch {
  viewer: string
  /** A prefix tsquery (see prefixQuery); omitted to list a conversation. */
  tsquery?: string | undefined
  with?: Conversation | undefined
  /** Keyset: only messages older than this one, newest first. */
  before?: { createdAt: string, id: string } | undefined
  limit: number
}

/** The SQL condition for the messages a viewer may read: sent, or received and not hidden. */
function readableBy (viewer: string): SQL {
  return sql`(${messages.sender} = ${viewer} OR EXISTS (SELECT 1 FROM ${deliveries} WHERE ${deliveries.messageId} = ${messages.id} AND ${deliveries.recipient} = ${viewer} AND ${deliveries.hiddenAt} IS NULL))`
}

/** Builds the search query (exposed so a test can EXPLAIN exactly what runs). */
export function messageSearchQuery (db: Db, s: MessageSearch) {
  const conversation = s.with === undefined
    ? undefined
    : s.with.kind === 'group'
      ? eq(messages.recipient, s.with.id)
      : or(
        and(eq(messages.sender, s.viewer), eq(messages.recipient, s.with.address)),
        and(eq(messages.sender, s.with.address), eq(messages.recipient, s.viewer))
      )
  return db.select().from(messages)
    .where(and(
      s.tsquery === undefined ? undefined : sql`${messages.search} @@ to_tsquery('simple', ${s.tsquery})`,
      readableBy(s.viewer),
      conversation,
      s.before === undefined ? undefined : sql`(${messages.createdAt}, ${messages.id}) < (${s.before.createdAt}::timestamptz, ${s.before.id})`
    ))
    .orderBy(desc(messages.createdAt), desc(messages.id))
    .limit(s.limit)
}

export async function searchMessages (db: Db, s: MessageSearch): Promise<MessageRow[]> {
  return messageSearchQuery(db, s)
}
