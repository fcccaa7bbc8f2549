import { and, desc, eq, isNull, or, sql, type SQL } from 'drizzle-orm'
import { union } from 'drizzle-orm/pg-core'
import type { Db } from '../../db/client.js'
import { queryRows } from '../../db/rows.js'
import { opened } from '../messages/messages.repository.js'
import { deliveries, messageColumns, messages, type MessageRow } from '../messages/messages.table.js'
import { holdsQuery, querySearchHashes } from '../../sealing/search-terms.js'

export type Conversation =
  | { kind: 'user', address: string }
  | { kind: 'group', id: string }

export interface MessageSearch {
  viewer: string
  /** The query's terms (search-terms.ts queryTerms), each a word prefix a match holds; omitted to list a conversation. */
  terms?: string[] | undefined
  with?: Conversation | undefined
  /** Keyset: only messages older than this one, newest first. */
  before?: { createdAt: string, id: string } | undefined
  limit: number
}

/**
 * Up to this many messages sent and received, a search starts from the caller's own messages
 * (found by the sender and recipient indexes) and checks each against the query: its cost is
 * what the caller can read, however large the table. Past it, the full-text index finds the
 * matches first and the permission filter keeps the caller's, which is cheaper for a reader of
 * that many messages. Measured in BENCHMARKS.md (search on 300,000 messages).
 */
export const READER_FIRST_MAX = 2_000

/** The messages a viewer may read: sent, or received and not hidden. */
function readableBy (viewer: string): SQL {
  return sql`(${messages.sender} = ${viewer} OR EXISTS (SELECT 1 FROM ${deliveries} WHERE ${deliveries.messageId} = ${messages.id} AND ${deliveries.recipient} = ${viewer} AND ${deliveries.hiddenAt} IS NULL))`
}

/**
 * Messages whose search hashes hold every term's: under the active key, or under another
 * configured key for rows rotation has not re-sealed yet (one array each, OR-ed; the GIN
 * index serves each).
 */
function holdsTerms (terms: string[]): SQL {
  const arrays = querySearchHashes(terms).map((hashes) => sql`${messages.searchHashes} @> ${hashes}::int[]`)
  return arrays.length === 1 ? arrays[0]! : sql`(${sql.join(arrays, sql` OR `)})`
}

/** The query's conditions other than who may read: its words, its conversation, its page. */
function narrowedBy (s: MessageSearch): SQL | undefined {
  const conversation = s.with === undefined
    ? undefined
    : s.with.kind === 'group'
      ? eq(messages.recipient, s.with.id)
      : or(
        and(eq(messages.sender, s.viewer), eq(messages.recipient, s.with.address)),
        and(eq(messages.sender, s.with.address), eq(messages.recipient, s.viewer))
      )
  return and(
    s.terms === undefined ? undefined : holdsTerms(s.terms),
    conversation,
    s.before === undefined ? undefined : sql`(${messages.createdAt}, ${messages.id}) < (${s.before.createdAt}::timestamptz, ${s.before.id})`
  )
}

/** The table-first plan (exposed so a test can EXPLAIN exactly what runs). */
export function messageSearchQuery (db: Db, s: MessageSearch) {
  return db.select(messageColumns).from(messages)
    .where(and(narrowedBy(s), readableBy(s.viewer)))
    .orderBy(desc(messages.createdAt), desc(messages.id))
    .limit(s.limit)
}

/** The reader-first plan: the caller's messages, then the query's conditions on each. */
export function readerFirstQuery (db: Db, s: MessageSearch) {
  const readable = db.$with('readable').as(union(
    db.select({ id: messages.id }).from(messages).where(eq(messages.sender, s.viewer)),
    db.select({ id: deliveries.messageId }).from(deliveries).where(and(eq(deliveries.recipient, s.viewer), isNull(deliveries.hiddenAt)))
  ))
  return db.with(readable).select(messageColumns).from(readable)
    .innerJoin(messages, eq(messages.id, readable.id))
    .where(narrowedBy(s))
    .orderBy(desc(messages.createdAt), desc(messages.id))
    .limit(s.limit)
}

/**
 * Whether the viewer has sent and received (hidden ones included) at most `max` messages:
 * reads at most 2 × (max + 1) index entries, whatever the viewer's history.
 */
export async function readsAtMost (db: Db, viewer: string, max: number): Promise<boolean> {
  const [row] = await queryRows<{ n: string | number }>(db, sql`
    SELECT (SELECT count(*) FROM (SELECT 1 FROM ${messages} WHERE ${messages.sender} = ${viewer} LIMIT ${max + 1}) AS sent)
         + (SELECT count(*) FROM (SELECT 1 FROM ${deliveries} WHERE ${deliveries.recipient} = ${viewer} LIMIT ${max + 1}) AS received) AS n`)
  return Number(row!.n) <= max
}

/**
 * Rounds of candidates one page reads before it ends short. A query word past PREFIX_MAX is
 * looked up by its first PREFIX_MAX characters, so a caller can make every candidate fail the
 * exact check ("internationalq" against a table of "international"); each round re-runs the
 * index scan, so the rounds are bounded and grow: 1, 2, 4, 8 × the page's limit, at most
 * CANDIDATES_PER_ROUND_MAX a round.
 */
const SEARCH_ROUNDS_MAX = 4
const CANDIDATES_PER_ROUND_MAX = 1_000

export interface MessageSearchPage {
  rows: MessageRow[]
  /** Set when the rounds ran out before the page filled or the table ended: the last candidate read, where the next page starts. */
  resumeAfter?: { createdAt: string, id: string }
}

/**
 * A page of the viewer's messages matching the search, newest first, bodies opened. The index
 * finds candidates by keyed hashes (a query word past PREFIX_MAX is looked up by its start, and
 * a 32-bit hash may collide), so each candidate's opened body is checked against the words:
 * one that fails is dropped, and the page reads on past the last candidate until it is full,
 * the table has no more, or SEARCH_ROUNDS_MAX rounds have run (the page is then short and says
 * where to resume). Listing a conversation needs no choice of plan: the sender and recipient
 * indexes serve it.
 */
export async function searchMessages (db: Db, s: MessageSearch): Promise<MessageSearchPage> {
  const readerFirst = s.terms !== undefined && await readsAtMost(db, s.viewer, READER_FIRST_MAX)
  const found: MessageRow[] = []
  let before = s.before
  for (let round = 0; ; round++) {
    const page = { ...s, before, limit: Math.min(s.limit * 2 ** round, Math.max(s.limit, CANDIDATES_PER_ROUND_MAX)) }
    const rows = (readerFirst ? await readerFirstQuery(db, page) : await messageSearchQuery(db, page)).map(opened)
    for (const row of rows) if (s.terms === undefined || holdsQuery(row.body, s.terms)) found.push(row)
    const last = rows.at(-1)
    if (found.length >= s.limit || rows.length < page.limit || last === undefined) return { rows: found.slice(0, s.limit) }
    before = { createdAt: last.createdAt.toISOString(), id: last.id }
    if (round + 1 === SEARCH_ROUNDS_MAX) return { rows: found, resumeAfter: before }
  }
}
