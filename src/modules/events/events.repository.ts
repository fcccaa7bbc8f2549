import { and, asc, eq, gt, inArray, isNull, lte, or, sql, type Placeholder, type SQL } from 'drizzle-orm'
import type { Db } from '../../db/client.js'
import { dateOf, dateOrNull, queryRows, queryShaped, type DriverTime } from '../../db/rows.js'
import { keyMayRead } from '../keys/keys.repository.js'
import { openJson, record, sealJson } from '../../sealing/records.js'
import type { Event, EventData, EventType } from './events.schemas.js'
import { eventAcks, events, keyFeeds, type EventRow } from './events.table.js'
import { announceGrowth } from './announcements.repository.js'

/** An event of the catalogue (events.schemas.ts): a `type` and the `data` that type carries. */
export type EventOf = { [T in EventType]: { type: T, data: EventData<T> } }[EventType]

/** An event to append to `address`'s feed: tsc checks its data against its type's schema. */
export type NewEvent = EventOf & {
  address: string
  messageId?: string
  expiresAt?: Date
}

/** An event's `data` as JSON text, checked against its type: for a statement that writes the event itself. */
export type EventDataJson<T extends EventType> = string & { readonly eventType: T }

/** The send's statement writes message.received in SQL (send-batch.repository.ts): its data is built here, so tsc checks it like append's. */
export function eventDataJson<T extends EventType> (_type: T, data: EventData<T>): EventDataJson<T> {
  return JSON.stringify(data) as EventDataJson<T>
}

/**
 * The types whose data carries what a message says (its body, its files' names): sealed at rest
 * (API.md §11), a JSON string in the jsonb column under the key `sealed_by` names. The others
 * hold who, what and when, which the database sees anyway, and stay plain JSON that SQL reads.
 */
export const SEALED_EVENT_TYPES = ['message.received', 'message.edited'] as const satisfies readonly EventType[]
const SEALED: ReadonlySet<string> = new Set(SEALED_EVENT_TYPES)

/** An event's data as the row keeps it: sealed for a type that carries a message, else as it is. */
function storedData (type: EventType, data: unknown, messageId: string | undefined): { data: unknown, sealedBy: string | null } {
  if (!SEALED.has(type)) return { data, sealedBy: null }
  if (messageId === undefined) throw new Error(`a ${type} event needs its message id: it is sealed bound to it`)
  const { sealed, sealedBy } = sealJson(data, record.eventData(type, messageId))
  return { data: sealed, sealedBy }
}

/**
 * An event as the API answers it. The row holds what a producer wrote, checked by tsc against
 * the catalogue (append's NewEvent, or the send's statement for message.received): the cast
 * only restores the type the jsonb column forgets. A sealed row is opened here, the one way
 * out of the table; the send's statement seals message.received before its time is known, so
 * its message's createdAt is the event's own (the same statement's clock).
 */
export function toEvent (row: EventRow): Event {
  const createdAt = row.createdAt.toISOString()
  let data = row.data
  if (row.sealedBy !== null) {
    // Shared: every recipient's copy of a group message is this one ciphertext, read by each of their connections.
    data = openJson<unknown>(row.data, record.eventData(row.type, row.messageId ?? ''), row.sealedBy, true)
    if (row.type === 'message.received') {
      const message = (data as { message: { createdAt: string } }).message
      if (message.createdAt === '') message.createdAt = createdAt
    }
  }
  return { id: String(row.seq), type: row.type, createdAt, data } as Event
}

/** What an event costs in an answer besides its data: id, type, times, and the JSON around them. */
const EVENT_OVERHEAD_BYTES = 128

/** Whether key `keyId` (an id, or a column naming one) acknowledged the event row in scope: up to its mark, or by id past it. */
function ackedBy (keyId: string | SQL | Placeholder): SQL {
  return sql`(${events.seq} <= coalesce((SELECT ${keyFeeds.ackedThrough} FROM ${keyFeeds} WHERE ${keyFeeds.keyId} = ${keyId}), 0)
    OR EXISTS (SELECT 1 FROM ${eventAcks} WHERE ${eventAcks.keyId} = ${keyId} AND ${eventAcks.seq} = ${events.seq}))`
}

/**
 * Rows of one feed that a reader may see: not taken by the service (the bot's queue), not
 * lapsed, and, for a key, not acknowledged by that key (each key's acknowledgement is its own).
 */
const visible = (address: string | Placeholder | SQL, keyId?: string | Placeholder | SQL) => and(
  eq(events.address, address),
  isNull(events.ackedAt),
  or(isNull(events.expiresAt), gt(events.expiresAt, sql`now()`)),
  keyId === undefined ? undefined : sql`NOT ${ackedBy(keyId)}`
)

/**
 * The feed counter protocol, as two CTEs for the statement that appends the events:
 * `recipients` names a relation with an `address` column, one row per event to append. `locked`
 * takes the recipients' user rows in address order (so two writers never deadlock), and `feed`
 * answers, per address, `event_seq` (the feed's last id now) and `n` (ids taken: the new ones
 * are event_seq - n + 1 .. event_seq); an address with no user, or whose user an operator has
 * deactivated, gets no row: nothing is written to a deactivated user's feed (a deactivation
 * that commits first is seen, as the lock waits for it and re-reads the row). The rows stay
 * locked to commit, so a feed's events become visible in id order: a reader following
 * `after = last` cannot miss one that commits late with a smaller id.
 */
export function takeFeedIds (recipients: SQL): SQL {
  return sql`locked AS (
      SELECT address FROM users WHERE address IN (SELECT address FROM ${recipients}) AND deactivated_at IS NULL
      ORDER BY address FOR NO KEY UPDATE
    ), feed AS (
      -- locked runs to its end first, once (a one-time filter, not a join: the generic plan, which
      -- guesses a few rows, joined the two in a nested loop, quadratic in a group batch's feeds).
      -- The update must touch only rows locked has already taken, in its order: a filter that
      -- refers to the row (IN, EXISTS, a join) lets the two interleave, and writers deadlock.
      UPDATE users SET event_seq = users.event_seq + g.n
      -- Only the feeds locked took: a deactivated user's feed does not grow (and its row is not touched).
      FROM (SELECT address, count(*) AS n FROM ${recipients} WHERE address IN (SELECT address FROM locked) GROUP BY address) AS g
      WHERE users.address = g.address AND (SELECT count(*) FROM locked) >= 0
      RETURNING users.address, users.event_seq, g.n
    )`
}

/** What a page read is given: each a value's placeholder, or a column of the relation it is read for. */
interface PageInputs {
  address: Placeholder | SQL
  after: Placeholder | SQL
  limit: Placeholder | SQL
  maxBytes: Placeholder | SQL
  keyId?: Placeholder | SQL
}

/**
 * A page read's statement (events.page(), one read of FeedReads' batch): up to `limit` visible
 * events after `after`, cut short once they hold `maxBytes` as JSON.
 */
function pageStatement ({ address, after, limit, maxBytes, keyId }: PageInputs): SQL {
  const stored = sql`pg_column_size(${events.data}) + ${EVENT_OVERHEAD_BYTES}`
  const candidates = sql`SELECT ${events.address}, ${events.seq}, ${events.type}, ${events.data}, ${events.sealedBy}, ${events.messageId},
      ${events.createdAt}, ${events.expiresAt}, ${events.ackedAt}, sum(${stored}) OVER (ORDER BY ${events.seq}) - (${stored}) AS stored_before
    FROM ${events}
    WHERE ${and(visible(address, keyId), gt(events.seq, after), keyId === undefined ? undefined : keyMayRead(keyId, address))}
    ORDER BY ${events.seq} LIMIT ${limit}`
  const text = sql`octet_length(c.data::text) + ${EVENT_OVERHEAD_BYTES}`
  return sql`SELECT address, seq, type, data, sealed_by, message_id, created_at, expires_at, acked_at
    FROM (SELECT c.*, sum(${text}) OVER (ORDER BY c.seq) - (${text}) AS before
      FROM (${candidates}) c WHERE c.stored_before < ${maxBytes}) sized
    WHERE before < ${maxBytes} ORDER BY seq`
}

/** events.page()'s statement, values as placeholders (address, after, limit, maxBytes, keyId). */
const onePage = (withKey: boolean): SQL => pageStatement({
  address: sql.placeholder('address'),
  after: sql.placeholder('after'),
  limit: sql.placeholder('limit'),
  maxBytes: sql.placeholder('maxBytes'),
  keyId: withKey ? sql.placeholder('keyId') : undefined
})

/**
 * Many keyed page reads in one statement (events.pages()): one row of arrays per read, each
 * read's page as events.page() would find it, its rows tagged with the read's place (`read`, from 1).
 * No ORDER BY over the whole answer: it could sort up to 32 pages (work_mem, then disk) for an
 * order pages() restores per read.
 */
const manyPages = (): SQL => sql`SELECT r.i AS read, p.* FROM unnest(${sql.placeholder('addresses')}::text[], ${sql.placeholder('afters')}::bigint[],
    ${sql.placeholder('limits')}::int[], ${sql.placeholder('maxBytes')}::int[], ${sql.placeholder('keyIds')}::text[])
    WITH ORDINALITY AS r(address, after, lim, max_bytes, key_id, i)
  CROSS JOIN LATERAL (${pageStatement({ address: sql`r.address`, after: sql`r.after`, limit: sql`r.lim`, maxBytes: sql`r.max_bytes`, keyId: sql`r.key_id` })}) p`

/** One keyed read of a feed, for events.pages(): events.page()'s arguments. */
export interface PageRead {
  address: string
  after: number
  limit: number
  maxBytes: number
  keyId: string
}

/** An events row as the driver gives it from raw SQL: times as text, seq as text (or a bigint). */
interface RawEventRow {
  address: string
  seq: string | number | bigint
  type: string
  data: unknown
  sealed_by: string | null
  message_id: string | null
  created_at: DriverTime
  expires_at: DriverTime | null
  acked_at: DriverTime | null
}

function eventRowOf (raw: RawEventRow): EventRow {
  return {
    address: raw.address,
    seq: Number(raw.seq),
    type: raw.type,
    data: raw.data,
    sealedBy: raw.sealed_by,
    messageId: raw.message_id,
    createdAt: dateOf(raw.created_at),
    expiresAt: dateOrNull(raw.expires_at),
    ackedAt: dateOrNull(raw.acked_at)
  }
}

export function createEventsRepository (db: Db) {
  return {
    /**
     * Takes the next ids of feeds, `counts` of them each (takeFeedIds), in one statement; call
     * it inside the transaction that makes the change. Answers each address's first new id; an
     * address with no user is missing from the answer.
     */
    async reserve (counts: Map<string, number>): Promise<Map<string, number>> {
      const addresses = [...counts.keys()]
      if (addresses.length === 0) return new Map()
      const taken = await queryRows<{ address: string, first: string | number }>(db, sql`
        WITH wanted AS (
          SELECT v.address FROM unnest(${sql.param(addresses)}::text[], ${sql.param(addresses.map((a) => counts.get(a)!))}::int[]) AS v(address, n),
            generate_series(1, v.n)
        ), ${takeFeedIds(sql`wanted`)}
        SELECT address, event_seq - n + 1 AS first FROM feed`)
      return new Map(taken.map((r) => [r.address, Number(r.first)]))
    },

    /**
     * Appends events to feeds inside the caller's transaction: their ids, then one statement.
     * Only in a transaction: the feed rows reserve locks are what prove each address a user
     * until the events commit (events.address has no foreign key; see events.table.ts). An
     * event for an address reserve gave no feed (a deactivated user, or none) is dropped.
     */
    async append (newEvents: NewEvent[]): Promise<void> {
      if (newEvents.length === 0) return
      const counts = new Map<string, number>()
      for (const e of newEvents) counts.set(e.address, (counts.get(e.address) ?? 0) + 1)
      const next = await this.reserve(counts)
      // Each distinct data sealed and written as JSON once: a group's event goes to every
      // member with the same data.
      const stored = new Map<unknown, { json: string, sealedBy: string | null }>()
      const storedOnce = (e: NewEvent) => {
        let found = stored.get(e.data)
        if (found === undefined) {
          const { data, sealedBy } = storedData(e.type, e.data, e.messageId)
          stored.set(e.data, found = { json: JSON.stringify(data), sealedBy })
        }
        return found
      }
      const rows: { address: string, seq: number, type: string, json: string, sealedBy: string | null, messageId: string | null, expiresAt: string | null }[] = []
      for (const e of newEvents) {
        const seq = next.get(e.address)
        if (seq === undefined) continue
        next.set(e.address, seq + 1)
        rows.push({ address: e.address, seq, type: e.type, ...storedOnce(e), messageId: e.messageId ?? null, expiresAt: e.expiresAt?.toISOString() ?? null })
      }
      if (rows.length === 0) return
      // One array a column, whatever the number of events: a VALUES list of 999 rows (a reaction
      // or a typing start in a 1,000-member group) was 7,000 parameters for the query builder
      // to write and the database to parse and plan, and held the event loop ~90 ms.
      const column = (value: (row: typeof rows[number]) => unknown) => sql.param(rows.map(value))
      await db.execute(sql`INSERT INTO ${events} (address, seq, type, data, sealed_by, message_id, expires_at)
        SELECT address, seq, type, data::jsonb, sealed_by, message_id, expires_at::timestamptz
        FROM unnest(${column((r) => r.address)}::text[], ${column((r) => r.seq)}::bigint[], ${column((r) => r.type)}::text[],
          ${column((r) => r.json)}::text[], ${column((r) => r.sealedBy)}::text[], ${column((r) => r.messageId)}::text[],
          ${column((r) => r.expiresAt)}::text[]) AS r(address, seq, type, data, sealed_by, message_id, expires_at)`)
      // Listeners hear of it once the caller's transaction commits (announcements.repository.ts).
      announceGrowth(db, next.keys())
    },

    /**
     * When an event written now in this transaction lapses after `ms`: its createdAt is the
     * transaction's now(), so both times come from the database's one clock (#14.8).
     */
    async expiryAfter (ms: number): Promise<Date> {
      const [row] = await queryRows<{ expires: string | Date }>(db, sql`SELECT now() + make_interval(secs => ${ms / 1000}) AS expires`)
      return new Date(row!.expires)
    },

    /** Unacknowledged, unlapsed events of one feed with id > after, oldest first. */
    async list (address: string, after: number, limit: number): Promise<EventRow[]> {
      return db.select().from(events)
        .where(and(visible(address), gt(events.seq, after)))
        .orderBy(asc(events.seq))
        .limit(limit)
    },

    /**
     * list(), cut short once the events returned hold `maxBytes` as JSON: the events up to the
     * one that reaches it (always at least one), so one answer's size is bounded however large
     * the events, and a reader resuming after the last still skips nothing. The database sends
     * only the rows kept. Sizes are summed in two passes: first as stored (free to read; for
     * incompressible data about the size as text, so it stops the scan near the cap), then as
     * text for what remains. Compressible events pass the first cut and cost their conversion,
     * as sending them did before; a stored size larger than the text only shortens a page.
     * With `keyId`, nothing while that key may not read (revoked, expired, without read, its
     * user deactivated), decided in the same statement: an event committed after a revocation
     * is never returned for the revoked key, whatever the key cache believes.
     */
    async page (address: string, after: number, limit: number, maxBytes: number, keyId?: string): Promise<EventRow[]> {
      // Built once per shape (with a key's check or without), values as parameters: building
      // it anew through the query builder was a fifth of a server's CPU under 5,000 streams and
      // long-polls, each wake-up a read (bench:connections' profile).
      const rows = await queryShaped<RawEventRow>(db, keyId === undefined ? 'events.page' : 'events.page.key', () => onePage(keyId !== undefined),
        { address, after, limit, maxBytes, keyId })
      return rows.map(eventRowOf)
    },

    /**
     * page() for each of `reads` (each with its key's check), in one statement: what one NOTIFY
     * wakes (a group's members, every stream of a user) reads its feeds together (feed-reads.ts).
     * Answers each read's rows, in the order of `reads`.
     */
    async pages (reads: readonly PageRead[]): Promise<EventRow[][]> {
      const found = await queryShaped<RawEventRow & { read: string | number }>(db, 'events.pages', manyPages, {
        addresses: reads.map((r) => r.address),
        afters: reads.map((r) => r.after),
        limits: reads.map((r) => r.limit),
        maxBytes: reads.map((r) => r.maxBytes),
        keyIds: reads.map((r) => r.keyId)
      })
      const answers: EventRow[][] = reads.map(() => [])
      for (const row of found) answers[Number(row.read) - 1]!.push(eventRowOf(row))
      // Each read's rows in id order (they come so; the statement does not promise it).
      for (const rows of answers) rows.sort((a, b) => a.seq - b.seq)
      return answers
    },

    /**
     * Takes the oldest unacknowledged event of `type` in a feed that no other transaction has
     * taken (FOR UPDATE SKIP LOCKED), acknowledged in the caller's transaction: a feed as a
     * queue that several instances share, each event taken once, and again after a crash.
     */
    async takeOldest (address: string, type: EventType): Promise<EventRow | undefined> {
      const [row] = await db.select().from(events)
        .where(and(eq(events.address, address), eq(events.type, type), isNull(events.ackedAt)))
        .orderBy(asc(events.seq))
        .limit(1)
        .for('update', { skipLocked: true })
      if (row !== undefined) await db.update(events).set({ ackedAt: sql`now()` }).where(and(eq(events.address, address), eq(events.seq, row.seq)))
      return row
    },

    /**
     * Acknowledges events of `address`'s feed for key `keyId` only (the user's other keys still
     * receive them): every id up to `upTo`, or up to the feed's last id if `upTo` is past it
     * (the key's mark moves forward, never back, and never ahead of the feed), and the
     * listed ids past the mark that the feed holds (others are ignored). Ids the mark passes
     * are folded into it. One statement.
     */
    async acknowledge (address: string, keyId: string, ids: number[], upTo: number | undefined): Promise<void> {
      await db.execute(sql`
        WITH mark AS (
          -- Never past the feed's last id: a mark ahead of it would hide events still to come.
          INSERT INTO ${keyFeeds} AS f (key_id, acked_through)
          SELECT ${keyId}, least(${upTo ?? 0}::bigint, (SELECT event_seq FROM users WHERE address = ${address}))
          ON CONFLICT (key_id) DO UPDATE SET acked_through = greatest(f.acked_through, excluded.acked_through)
          RETURNING acked_through
        ), listed AS (
          INSERT INTO ${eventAcks} (key_id, seq)
          SELECT ${keyId}, e.seq FROM ${events} e
          WHERE e.address = ${address} AND e.seq = ANY(${sql.param(ids)}::bigint[]) AND e.seq > (SELECT acked_through FROM mark)
          ON CONFLICT DO NOTHING
        )
        DELETE FROM ${eventAcks} WHERE key_id = ${keyId} AND seq <= (SELECT acked_through FROM mark)`)
    },

    /**
     * DELETE /events: for key `keyId`, every event up to `upTo`, or every event the feed holds
     * now, is acknowledged (the events themselves go once every key of the user has them; purge).
     */
    async remove (address: string, keyId: string, upTo: number | undefined): Promise<void> {
      const last = upTo ?? Number((await queryRows<{ seq: string | number }>(db, sql`SELECT event_seq AS seq FROM users WHERE address = ${address}`))[0]?.seq ?? 0)
      await this.acknowledge(address, keyId, [], last)
    },

    /**
     * Erases every feed's copy of these messages (message.received and message.edited carry a
     * body), or only `address`'s feed's copies (a recipient hiding one).
     */
    async eraseCopies (messageIds: string[], address?: string): Promise<void> {
      if (messageIds.length === 0) return
      await db.delete(events).where(and(
        messageIds.length === 1 ? eq(events.messageId, messageIds[0]!) : sql`${events.messageId} = ANY(${sql.param(messageIds)}::text[])`,
        inArray(events.type, ['message.received', 'message.edited']),
        address === undefined ? undefined : eq(events.address, address)
      ))
    },

    /** Erasure: the message.reaction events `from` caused about these messages, in every feed (they carry its emoji). */
    async eraseReactionsFrom (from: string, messageIds: string[]): Promise<void> {
      if (messageIds.length === 0) return
      await db.delete(events).where(and(
        sql`${events.messageId} = ANY(${sql.param(messageIds)}::text[])`,
        eq(events.type, 'message.reaction'),
        sql`${events.data}->>'from' = ${from}`
      ))
    },

    /** Erasure: up to `limit` of the oldest events of `address`'s feed, removed; answers how many. */
    async removeOldest (address: string, limit: number): Promise<number> {
      const some = db.select({ seq: events.seq }).from(events).where(eq(events.address, address)).orderBy(asc(events.seq)).limit(limit)
      const gone = await db.delete(events).where(and(eq(events.address, address), inArray(events.seq, some))).returning({ seq: events.seq })
      return gone.length
    },

    /**
     * Every event about these messages, whatever its type (their bodies in message.received
     * and message.edited, their ids in message.status and message.reaction): for retention,
     * which purges the messages without a trace in any feed.
     */
    async eraseMessages (messageIds: string[]): Promise<void> {
      if (messageIds.length === 0) return
      await db.delete(events).where(sql`${events.messageId} = ANY(${sql.param(messageIds)}::text[])`)
    },

    /**
     * Retention: an event every active key of its user has acknowledged (while the user has
     * one; no webhook of the user still to send it), one the service took 7 days ago, any event
     * after 30 days, lapsed typing at once; then acknowledgements of events no longer there.
     */
    async purge (): Promise<number> {
      const activeKey = sql`k.address = ${events.address} AND k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > now()) AND 'read' = ANY(k.scopes)`
      const gone = await db.delete(events).where(or(
        lte(events.ackedAt, sql`now() - interval '7 days'`),
        lte(events.createdAt, sql`now() - interval '30 days'`),
        lte(events.expiresAt, sql`now() - interval '1 minute'`),
        sql`(EXISTS (SELECT 1 FROM api_keys k WHERE ${activeKey})
          AND NOT EXISTS (SELECT 1 FROM api_keys k WHERE ${activeKey} AND NOT ${ackedBy(sql`k.id`)})
          AND NOT EXISTS (SELECT 1 FROM webhooks w WHERE w.address = ${events.address} AND w.disabled_at IS NULL AND w.delivered_through < ${events.seq}))`
      )).returning({ seq: events.seq })
      await db.execute(sql`DELETE FROM ${eventAcks} a WHERE NOT EXISTS (
        SELECT 1 FROM ${events} e JOIN api_keys k ON k.address = e.address WHERE k.id = a.key_id AND e.seq = a.seq)`)
      return gone.length
    }
  }
}
