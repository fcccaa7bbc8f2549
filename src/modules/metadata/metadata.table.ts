import { jsonb, pgTable, text } from 'drizzle-orm/pg-core'
import { timestamptz } from '../../db/columns.js'

/** One shared key → JSON map per entity (a user address, a group id or a message id). */
export const metadata = pgTable('metadata', {
  entity: text('entity').primaryKey(),
  data: jsonb('data').$type<Record<string, unknown>>().notNull(),
  updatedAt: timestamptz('updated_at').notNull().defaultNow()
})

export type MetadataRow = typeof metadata.$inferSelect
