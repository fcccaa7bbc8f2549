import { date, integer, pgTable, primaryKey, text } from 'drizzle-orm/pg-core'

/** Messages sent per API key per UTC day; incremented in the send's own transaction. */
export const quotaUsage = pgTable('quota_usage', {
  keyId: text('key_id').notNull(),
  day: date('day', { mode: 'string' }).notNull(),
  count: integer('count').notNull().default(0)
}, (t) => [primaryKey({ columns: [t.keyId, t.day] })])
