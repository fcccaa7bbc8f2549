import { jsonb, pgTable, text } from 'drizzle-orm/pg-core'
import { timestamptz } from './columns.js'

/** Facts about this installation, such as whether the demo key was ever handed out. */
export const instanceSettings = pgTable('instance_settings', {
  key: text('key').primaryKey(),
  value: jsonb('value').notNull(),
  updatedAt: timestamptz('updated_at').notNull().defaultNow()
})
