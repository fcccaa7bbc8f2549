import { pgTable, primaryKey, text } from 'drizzle-orm/pg-core'
import { timestamptz } from '../../db/columns.js'
import { users } from '../users/users.table.js'

/** Each user's contact list: users and groups, with an optional name of the owner's choosing. */
export const rosterEntries = pgTable('roster_entries', {
  owner: text('owner').notNull().references(() => users.address, { onDelete: 'cascade' }),
  entity: text('entity').notNull(),
  type: text('type', { enum: ['user', 'group'] }).notNull(),
  name: text('name'),
  addedAt: timestamptz('added_at').notNull().defaultNow()
}, (t) => [primaryKey({ columns: [t.owner, t.entity] })])

export type RosterRow = typeof rosterEntries.$inferSelect
