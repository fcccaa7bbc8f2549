import { bigint, index, jsonb, pgTable, primaryKey, text } from 'drizzle-orm/pg-core'
import { sql } from 'drizzle-orm'
import { timestamptz } from '../../db/columns.js'

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
  // The message an event is about, so deleting a message can erase its copies in feeds.
  messageId: text('message_id'),
  createdAt: timestamptz('created_at').notNull().defaultNow(),
  // Typing indicators lapse; a lapsed event is no longer returned.
  expiresAt: timestamptz('expires_at'),
  ackedAt: timestamptz('acked_at')
}, (t) => [
  primaryKey({ columns: [t.address, t.seq] }),
  // No index on created_at: retention's purge (acknowledged, old or lapsed: one OR over three
  // columns) reads the whole table with or without one, and every event written paid for it.
  index('events_message_idx').on(t.messageId).where(sql`${t.messageId} IS NOT NULL`)
])

export type EventRow = typeof events.$inferSelect
