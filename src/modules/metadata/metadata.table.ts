import { jsonb, pgTable, text } from 'drizzle-orm/pg-core'
import { timestamptz } from '../../db/columns.js'

/** One shared key → JSON map per entity (a user address, a group id or a message id). */
export const metadata = pgTable('metadata', {
  entity: text('entity').primaryKey(),
  // Sealed: a JSON string, the map's JSON sealed under sealed_by's key (base64); NULL: the map as it is.
  data: jsonb('data').$type<unknown>().notNull(),
  sealedBy: text('sealed_by'),
  updatedAt: timestamptz('updated_at').notNull().defaultNow()
})

export type MetadataRow = typeof metadata.$inferSelect
