import { bigint, index, jsonb, pgTable, primaryKey, text } from 'drizzle-orm/pg-core'
import { sql } from 'drizzle-orm'
import { timestamptz } from '../../db/columns.js'
import { apiKeys } from '../keys/keys.table.js'

/**
 * One feed per user. `seq` is the event id, increasing within the feed (see users.event_seq).
 * `address` names a user without a foreign key: every event is written in the transaction that
 * took its id from the user's row (takeFeedIds: the send's own statement, or append's
 * reserve), which proves the user is there and holds the row locked to commit, so a per-row
 * key check would only repeat it (on a send to a group of 20, 19 times). Deleting a user
 * deletes its events by trigger (migration 0013), as the key's cascade did.
 */
export const events = pgTable('events', {
  address: text('address').notNull(),
  seq: bigint('seq', { mode: 'number' }).notNull(),
  type: text('type').notNull(),
  data: jsonb('data').notNull(),
  // The types that carry a message (SEALED_EVENT_TYPES) hold `data` as a JSON string, its JSON
  // sealed under this key (base64); NULL: plain JSON, as every other type is.
  sealedBy: text('sealed_by'),
  // The message an event is about, so deleting a message can erase its copies in feeds.
  messageId: text('message_id'),
  createdAt: timestamptz('created_at').notNull().defaultNow(),
  // Typing indicators lapse; a lapsed event is no longer returned.
  expiresAt: timestamptz('expires_at'),
  // Taken by the service itself (the test bot's queue, takeOldest): no key reads it any more.
  ackedAt: timestamptz('acked_at')
}, (t) => [
  primaryKey({ columns: [t.address, t.seq] }),
  // No index on created_at: retention's purge (acknowledged, old or lapsed: one OR over three
  // columns) reads the whole table with or without one, and every event written paid for it.
  index('events_message_idx').on(t.messageId).where(sql`${t.messageId} IS NOT NULL`)
])

/**
 * How far each API key has acknowledged its user's feed (API.md §10: one key's
 * acknowledgement is its own): every event up to `ackedThrough` (POST /events/ack upTo,
 * DELETE /events), and beyond it the ids in event_acks. A key without a row has acknowledged
 * nothing. Both go with the key.
 */
export const keyFeeds = pgTable('key_feeds', {
  keyId: text('key_id').primaryKey().references(() => apiKeys.id, { onDelete: 'cascade' }),
  ackedThrough: bigint('acked_through', { mode: 'number' }).notNull().default(0)
})

/** Events a key acknowledged by id past its key_feeds mark (folded into the mark as it passes them). */
export const eventAcks = pgTable('event_acks', {
  keyId: text('key_id').notNull().references(() => apiKeys.id, { onDelete: 'cascade' }),
  seq: bigint('seq', { mode: 'number' }).notNull()
}, (t) => [primaryKey({ columns: [t.keyId, t.seq] })])

export type EventRow = typeof events.$inferSelect
