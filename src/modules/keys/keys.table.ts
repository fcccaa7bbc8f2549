import { index, integer, pgTable, text } from 'drizzle-orm/pg-core'
import { timestamptz } from '../../db/columns.js'
import { users } from '../users/users.table.js'

export const apiKeys = pgTable('api_keys', {
  id: text('id').primaryKey(),
  address: text('address').notNull().references(() => users.address, { onDelete: 'cascade' }),
  // SHA-256 of the secret, hex. The secret itself is never stored.
  secretHash: text('secret_hash').notNull(),
  // Per-key override of DAILY_MESSAGE_QUOTA; null means the configured default.
  dailyQuota: integer('daily_quota'),
  createdAt: timestamptz('created_at').notNull().defaultNow(),
  revokedAt: timestamptz('revoked_at')
}, (t) => [index('api_keys_address_idx').on(t.address)])

export type ApiKeyRow = typeof apiKeys.$inferSelect
