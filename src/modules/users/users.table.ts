import { bigint, boolean, pgTable, text } from 'drizzle-orm/pg-core'
import { timestamptz } from '../../db/columns.js'

export const users = pgTable('users', {
  // Stored lower-case; the API compares addresses case-insensitively (API.md §1).
  address: text('address').primaryKey(),
  displayName: text('display_name'),
  bot: boolean('bot').notNull().default(false),
  createdAt: timestamptz('created_at').notNull().defaultNow(),
  // Set by an operator: the user's keys answer 401 and it receives nothing until reactivated.
  deactivatedAt: timestamptz('deactivated_at'),
  // The id of the newest event in this user's feed. Taking the next ids means locking this row,
  // so two transactions writing to one feed commit their events in id order (no skipped events).
  eventSeq: bigint('event_seq', { mode: 'number' }).notNull().default(0)
})

export type UserRow = typeof users.$inferSelect
