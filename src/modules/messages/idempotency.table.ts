import { index, pgTable, primaryKey, text } from 'drizzle-orm/pg-core'
import { timestamptz } from '../../db/columns.js'
import { messages } from './messages.table.js'

/**
 * Idempotency-Key of a send, per API key, kept 24 h. Points at the message it made, so a
 * replay answers that message; deleting the message for everyone deletes the record too.
 */
export const idempotencyKeys = pgTable('idempotency_keys', {
  keyId: text('key_id').notNull(),
  idempotencyKey: text('idempotency_key').notNull(),
  // SHA-256 over the send's fields (attachments by their own hashes).
  requestHash: text('request_hash').notNull(),
  messageId: text('message_id').notNull().references(() => messages.id, { onDelete: 'cascade' }),
  createdAt: timestamptz('created_at').notNull().defaultNow()
}, (t) => [
  primaryKey({ columns: [t.keyId, t.idempotencyKey] }),
  index('idempotency_keys_created_idx').on(t.createdAt)
])
