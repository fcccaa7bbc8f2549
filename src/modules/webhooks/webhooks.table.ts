import { sql } from 'drizzle-orm'
import { bigint, index, integer, pgTable, primaryKey, text } from 'drizzle-orm/pg-core'
import { timestamptz } from '../../db/columns.js'
import { apiKeys } from '../keys/keys.table.js'
import { users } from '../users/users.table.js'

/**
 * A user's webhook, and where its delivery stands. Events go out in feed order, one at a time:
 * `deliveredThrough` is the last event id done with (delivered, or not wanted by the filter),
 * the next is tried at `nextAttemptAt`, and an instance sending holds `leaseUntil` (taken with
 * FOR UPDATE SKIP LOCKED, so several instances share the work and never send the same event at
 * once; a lease that runs out, a crash, lets another take over: at least once).
 */
export const webhooks = pgTable('webhooks', {
  id: text('id').primaryKey(),
  address: text('address').notNull().references(() => users.address, { onDelete: 'cascade' }),
  // The key that registered it: it delivers only while that key is accepted (not revoked, not
  // expired, its user active). Null for webhooks registered before keys were recorded (0015):
  // those deliver while any read key of their user is accepted.
  keyId: text('key_id').references(() => apiKeys.id, { onDelete: 'cascade' }),
  url: text('url').notNull(),
  // Event types to deliver; null for every type.
  events: text('events').array(),
  // The HMAC key the receiver verifies signatures with: the service must hold it to sign.
  secret: text('secret').notNull(),
  createdAt: timestamptz('created_at').notNull().defaultNow(),
  disabledAt: timestamptz('disabled_at'),
  deliveredThrough: bigint('delivered_through', { mode: 'number' }).notNull(),
  nextAttemptAt: timestamptz('next_attempt_at').notNull().defaultNow(),
  // Since when the event at the head has been failing: past 24 h the webhook is disabled.
  failingSince: timestamptz('failing_since'),
  leaseUntil: timestamptz('lease_until'),
  // Which claim holds the lease: a holder whose lease ran out and was taken can record nothing.
  leaseToken: text('lease_token')
}, (t) => [
  index('webhooks_address_idx').on(t.address),
  index('webhooks_key_idx').on(t.keyId),
  index('webhooks_due_idx').on(t.nextAttemptAt).where(sql`disabled_at IS NULL`)
])

/** One row per event a webhook tried to deliver: its outcome, for GET /webhooks/{id}/deliveries. */
export const webhookDeliveries = pgTable('webhook_deliveries', {
  webhookId: text('webhook_id').notNull().references(() => webhooks.id, { onDelete: 'cascade' }),
  eventId: bigint('event_id', { mode: 'number' }).notNull(),
  status: text('status', { enum: ['pending', 'delivered', 'failed'] }).notNull(),
  attempts: integer('attempts').notNull().default(0),
  lastError: text('last_error'),
  lastAttemptAt: timestamptz('last_attempt_at'),
  // Asked for again (POST /webhooks/{id}/redeliver): sent before the feed's next event.
  redeliver: timestamptz('redeliver')
}, (t) => [
  primaryKey({ columns: [t.webhookId, t.eventId] }),
  index('webhook_deliveries_redeliver_idx').on(t.webhookId, t.eventId).where(sql`redeliver IS NOT NULL`)
])

export type WebhookRow = typeof webhooks.$inferSelect
export type WebhookDeliveryRow = typeof webhookDeliveries.$inferSelect
