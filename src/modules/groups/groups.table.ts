import { sql } from 'drizzle-orm'
import { index, integer, pgTable, primaryKey, text } from 'drizzle-orm/pg-core'
import { timestamptz } from '../../db/columns.js'
import { users } from '../users/users.table.js'

export const groups = pgTable('groups', {
  id: text('id').primaryKey(),
  name: text('name').notNull(),
  owner: text('owner').notNull().references(() => users.address, { onDelete: 'cascade' }),
  createdAt: timestamptz('created_at').notNull().defaultNow(),
  updatedAt: timestamptz('updated_at').notNull().defaultNow(),
  // Days its messages are kept (POST /group/{id}, by the owner); null: MESSAGE_RETENTION_DAYS
  // alone. The shorter of the two applies.
  retentionDays: integer('retention_days')
}, (t) => [
  // The few groups with a retention of their own, for each purge batch to visit.
  index('groups_retention_idx').on(t.id).where(sql`retention_days IS NOT NULL`)
])

export const groupMembers = pgTable('group_members', {
  groupId: text('group_id').notNull().references(() => groups.id, { onDelete: 'cascade' }),
  address: text('address').notNull().references(() => users.address, { onDelete: 'cascade' }),
  addedAt: timestamptz('added_at').notNull().defaultNow()
}, (t) => [
  primaryKey({ columns: [t.groupId, t.address] }),
  index('group_members_address_idx').on(t.address)
])

export type GroupRow = typeof groups.$inferSelect
