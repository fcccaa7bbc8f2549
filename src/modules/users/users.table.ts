import { sql } from 'drizzle-orm'
import { bigint, boolean, index, pgTable, text } from 'drizzle-orm/pg-core'
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
  // Updated with every event, so the table keeps 30 % of each page free for those updates to stay
  // on their page (fillfactor 70, migration 0026; drizzle's schema cannot say it).
  eventSeq: bigint('event_seq', { mode: 'number' }).notNull().default(0),
  // Erasure (DELETE /admin/users/{user}, API.md §14): when an operator asked for it, and when the
  // background job finished. The row itself stays, deactivated: the address stays reserved.
  erasureRequestedAt: timestamptz('erasure_requested_at'),
  erasedAt: timestamptz('erased_at')
}, (t) => [
  // The erasure job's look for work on every instance, every minute: the few pending rows only.
  index('users_erasure_pending_idx').on(t.erasureRequestedAt).where(sql`erasure_requested_at IS NOT NULL AND erased_at IS NULL`)
])

export type UserRow = typeof users.$inferSelect
