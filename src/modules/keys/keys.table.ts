import { sql } from 'drizzle-orm'
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
  // What the key may do (API.md §9): read, send, admin.
  scopes: text('scopes').array().notNull().default(sql`ARRAY['read', 'send']::text[]`),
  createdAt: timestamptz('created_at').notNull().defaultNow(),
  revokedAt: timestamptz('revoked_at'),
  // After this the key answers 401; null: never.
  expiresAt: timestamptz('expires_at'),
  // Written at most once a minute per key and process, so using a key costs no write per request.
  lastUsedAt: timestamptz('last_used_at')
}, (t) => [index('api_keys_address_idx').on(t.address)])

export type ApiKeyRow = typeof apiKeys.$inferSelect
