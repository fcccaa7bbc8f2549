import { bigint, index, jsonb, pgTable, primaryKey, text } from 'drizzle-orm/pg-core'
import { sql } from 'drizzle-orm'
import { timestamptz } from '../../db/columns.js'
import { users } from '../users/users.table.js'

/** One feed per user. `seq` is the event id, increasing within the feed (see users.event_seq). */
export const events = pgTable('events', {
  address: text('address').notNull().references(() => users.address, { onDelete: 'cascade' }),
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
