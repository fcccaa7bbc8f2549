import { boolean, pgTable, text } from 'drizzle-orm/pg-core'
import { timestamptz } from '../../db/columns.js'

export const users = pgTable('users', {
  // Stored lower-case; the API compares addresses case-insensitively (API.md §1).
  address: text('address').primaryKey(),
  displayName: text('display_name'),
  bot: boolean('bot').notNull().default(false),
  createdAt: timestamptz('created_at').notNull().defaultNow()
})

export type UserRow = typeof users.$inferSelect
