import { index, pgTable, primaryKey, text } from 'drizzle-orm/pg-core'
import { timestamptz } from '../../db/columns.js'

/**
 * Idempotency-Key of a send, per API key, kept 24 h. Names the message it made, so a replay
 * answers that message. Deliberately no foreign key: the record outlives its message's
 * deletion, so a retry after deletion is answered 404 rather than sending the message again.
 */
export const idempotencyKeys = pgTable('idempotency_keys', {
  keyId: text('key_id').notNull(),
  idempotencyKey: text('idempotency_key').notNull(),
  // SHA-256 over the send's fields (attachments by their own hashes).
  // A keyed tag of the request under sealed_by's key (Keyring.tag): it confirms no guessed body.
  requestHash: text('request_hash').notNull(),
  sealedBy: text('sealed_by'),
  messageId: text('message_id').notNull(),
  createdAt: timestamptz('created_at').notNull().defaultNow()
}, (t) => [
  primaryKey({ columns: [t.keyId, t.idempotencyKey] }),
  index('idempotency_keys_created_idx').on(t.createdAt)
])
