import { bigint, index, pgTable, text } from 'drizzle-orm/pg-core'
import { timestamptz } from '../../db/columns.js'
import type { AuditAction } from './audit.schemas.js'

/**
 * The audit log (API.md §14): one row per admin action or key change, written in the
 * transaction of the change itself. No foreign keys: an entry outlives the key, the user or
 * the webhook it names. The id grows with each entry, so it is the newest-first order and
 * the cursor; each filter has an index that ends in it, so a filtered page is an index range.
 */
export const auditLog = pgTable('audit_log', {
  id: bigint('id', { mode: 'number' }).primaryKey().generatedAlwaysAsIdentity(),
  at: timestamptz('at').notNull().defaultNow(),
  // Both null: the operator CLI (`parley`), which has no key.
  actorKeyId: text('actor_key_id'),
  actorAddress: text('actor_address'),
  action: text('action').$type<AuditAction>().notNull(),
  // A user address, a key id or a webhook id; never a secret.
  target: text('target').notNull(),
  // Null for the CLI: no request.
  requestId: text('request_id'),
  ip: text('ip')
}, (t) => [
  // actor_key_id IS NULL (the CLI) is a range of this index too.
  index('audit_log_actor_key_idx').on(t.actorKeyId, t.id),
  index('audit_log_actor_address_idx').on(t.actorAddress, t.id),
  index('audit_log_action_idx').on(t.action, t.id),
  index('audit_log_target_idx').on(t.target, t.id),
  // Retention's purge: the oldest first.
  index('audit_log_at_idx').on(t.at)
])

export type AuditRow = typeof auditLog.$inferSelect
