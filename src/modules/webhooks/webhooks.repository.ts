import { and, asc, desc, eq, gt, inArray, isNotNull, isNull, lt, sql } from 'drizzle-orm'
import type { Db } from '../../db/client.js'
import { queryRows } from '../../db/rows.js'
import { events, type EventRow } from '../events/events.table.js'
import { webhookDeliveries, webhooks, type WebhookDeliveryRow, type WebhookRow } from './webhooks.table.js'

/** What one delivery attempt came to, to record. */
export interface Attempt {
  eventId: number
  delivered: boolean
  error: string | null
  at: Date
}

/** A webhook's state after a batch: how far it got, and when to try again. */
export interface Progress {
  deliveredThrough: number
  /** Redeliveries done with (delivered), whose mark is cleared. */
  redelivered: number[]
  nextAttemptAt: Date
  /** Set while the head event keeps failing; null once it is delivered. */
  failingSince: Date | null
}

export function createWebhooksRepository (db: Db) {
  return {
    /**
     * A new webhook, delivering the events its user's feed gains from now on; undefined when
     * the user already has `max` webhooks. The user's row is locked first, so that two creates
     * at once count one after the other (the count runs in a statement of its own, which sees
     * what the other committed).
     */
    async create (w: { id: string, address: string, url: string, events: string[] | null, secret: string }, max: number): Promise<WebhookRow | undefined> {
      return db.transaction(async (tx) => {
        await tx.execute(sql`SELECT 1 FROM users WHERE address = ${w.address} FOR NO KEY UPDATE`)
        const [row] = await queryRows<{ id: string }>(tx, sql`
          INSERT INTO ${webhooks} (id, address, url, events, secret, delivered_through)
          SELECT ${w.id}, address, ${w.url}, ${w.events === null ? null : sql`${sql.param(w.events)}::text[]`}, ${w.secret}, event_seq
          FROM users WHERE address = ${w.address} AND (SELECT count(*) FROM ${webhooks} WHERE address = ${w.address}) < ${max}
          RETURNING id`)
        if (row === undefined) return undefined
        const [created] = await tx.select().from(webhooks).where(eq(webhooks.id, row.id))
        return created
      })
    },

    async list (address: string): Promise<WebhookRow[]> {
      return db.select().from(webhooks).where(eq(webhooks.address, address)).orderBy(asc(webhooks.createdAt), asc(webhooks.id))
    },

    async get (address: string, id: string): Promise<WebhookRow | undefined> {
      const [row] = await db.select().from(webhooks).where(and(eq(webhooks.address, address), eq(webhooks.id, id)))
      return row
    },

    /** Deletes the webhook and its delivery log; false when the user has no such webhook. */
    async remove (address: string, id: string): Promise<boolean> {
      const gone = await db.delete(webhooks).where(and(eq(webhooks.address, address), eq(webhooks.id, id))).returning({ id: webhooks.id })
      return gone.length > 0
    },

    /** One page of a webhook's delivery log, newest event first. */
    async deliveries (id: string, limit: number, before: number | undefined): Promise<WebhookDeliveryRow[]> {
      return db.select().from(webhookDeliveries)
        .where(and(eq(webhookDeliveries.webhookId, id), before === undefined ? undefined : lt(webhookDeliveries.eventId, before)))
        .orderBy(desc(webhookDeliveries.eventId))
        .limit(limit)
    },

    /**
     * Asks for an event to be sent again, before the feed's next one. False when the feed no
     * longer holds the event (or never did).
     */
    async markRedelivery (webhook: WebhookRow, eventId: number): Promise<boolean> {
      const [row] = await queryRows<{ event_id: string }>(db, sql`
        INSERT INTO ${webhookDeliveries} (webhook_id, event_id, status, redeliver)
        SELECT ${webhook.id}, seq, 'pending', now() FROM ${events} WHERE address = ${webhook.address} AND seq = ${eventId}
        ON CONFLICT (webhook_id, event_id) DO UPDATE SET redeliver = now(), status = 'pending'
        RETURNING event_id`)
      if (row === undefined) return false
      // Due now, even if it was waiting out a backoff.
      await db.update(webhooks).set({ nextAttemptAt: sql`now()` }).where(eq(webhooks.id, webhook.id))
      return true
    },

    /**
     * Leases up to `limit` webhooks that have something to send and are due, for `leaseMs`:
     * FOR UPDATE SKIP LOCKED and the lease keep any other instance off them until the lease
     * is released or runs out (a crashed holder's work is taken over then: at least once).
     */
    async claimDue (limit: number, leaseMs: number): Promise<WebhookRow[]> {
      const claimed = await queryRows<{ id: string }>(db, sql`
        UPDATE ${webhooks} SET lease_until = now() + make_interval(secs => ${leaseMs / 1000})
        WHERE id IN (
          SELECT w.id FROM ${webhooks} w
          WHERE w.disabled_at IS NULL AND w.next_attempt_at <= now() AND (w.lease_until IS NULL OR w.lease_until < now())
            AND (EXISTS (SELECT 1 FROM ${events} e WHERE e.address = w.address AND e.seq > w.delivered_through)
              OR EXISTS (SELECT 1 FROM ${webhookDeliveries} d WHERE d.webhook_id = w.id AND d.redeliver IS NOT NULL))
          ORDER BY w.next_attempt_at
          LIMIT ${limit}
          FOR UPDATE SKIP LOCKED)
        RETURNING id`)
      if (claimed.length === 0) return []
      return db.select().from(webhooks).where(inArray(webhooks.id, claimed.map((c) => c.id)))
    },

    /** The events to send next, in order: redeliveries first, then the feed after deliveredThrough. */
    async nextEvents (webhook: WebhookRow, limit: number): Promise<{ redeliveries: EventRow[], feed: EventRow[] }> {
      const redeliveries = await db.select({ event: events }).from(webhookDeliveries)
        .innerJoin(events, and(eq(events.address, webhook.address), eq(events.seq, webhookDeliveries.eventId)))
        .where(and(eq(webhookDeliveries.webhookId, webhook.id), isNotNull(webhookDeliveries.redeliver)))
        .orderBy(asc(webhookDeliveries.eventId))
        .limit(limit)
      const feed = await db.select().from(events)
        .where(and(eq(events.address, webhook.address), gt(events.seq, webhook.deliveredThrough)))
        .orderBy(asc(events.seq))
        .limit(limit)
      return { redeliveries: redeliveries.map((r) => r.event), feed }
    },

    /**
     * Records a round in one transaction: each attempt in the log (lastError is the last error
     * an event met, kept once it is delivered), the webhook's progress, and the lease released
     * (or renewed for `renewLeaseMs`, when another round follows). With `disable`, the webhook
     * is disabled and its owner told, in the same transaction (`disable` runs inside it).
     */
    async record (webhook: WebhookRow, attempts: Attempt[], progress: Progress, renewLeaseMs?: number, disable?: (tx: Db) => Promise<void>): Promise<void> {
      await db.transaction(async (tx) => {
        if (attempts.length > 0) {
          const rows = sql.join(attempts.map((a) => sql`(${webhook.id}::text, ${a.eventId}::bigint, ${a.delivered ? 'delivered' : disable !== undefined ? 'failed' : 'pending'}::text, ${a.error}::text, ${a.at.toISOString()}::timestamptz)`), sql`, `)
          await tx.execute(sql`
            INSERT INTO ${webhookDeliveries} (webhook_id, event_id, status, attempts, last_error, last_attempt_at)
            SELECT v.webhook_id, v.event_id, v.status, 1, v.last_error, v.at FROM (VALUES ${rows}) AS v(webhook_id, event_id, status, last_error, at)
            ON CONFLICT (webhook_id, event_id) DO UPDATE SET status = excluded.status, attempts = ${webhookDeliveries}.attempts + 1,
              last_error = COALESCE(excluded.last_error, ${webhookDeliveries}.last_error), last_attempt_at = excluded.last_attempt_at`)
        }
        if (progress.redelivered.length > 0) {
          await tx.update(webhookDeliveries).set({ redeliver: null })
            .where(and(eq(webhookDeliveries.webhookId, webhook.id), inArray(webhookDeliveries.eventId, progress.redelivered)))
        }
        await tx.update(webhooks).set({
          deliveredThrough: progress.deliveredThrough,
          nextAttemptAt: progress.nextAttemptAt,
          failingSince: progress.failingSince,
          leaseUntil: renewLeaseMs === undefined ? null : sql`now() + make_interval(secs => ${renewLeaseMs / 1000})`,
          ...(disable !== undefined ? { disabledAt: sql`now()` } : {})
        }).where(eq(webhooks.id, webhook.id))
        if (disable !== undefined) await disable(tx)
      })
    },

    /** The users with a webhook that is not disabled: whose feeds the dispatcher watches. */
    async watchedAddresses (): Promise<string[]> {
      const rows = await db.selectDistinct({ address: webhooks.address }).from(webhooks).where(isNull(webhooks.disabledAt))
      return rows.map((r) => r.address)
    },

    /** Gives a lease back without progress (shutdown). */
    async release (id: string): Promise<void> {
      await db.update(webhooks).set({ leaseUntil: null }).where(eq(webhooks.id, id))
    },

    /** Retention: the log of events the feed no longer holds. */
    async purgeLog (): Promise<number> {
      const gone = await db.delete(webhookDeliveries).where(sql`${webhookDeliveries.lastAttemptAt} < now() - interval '30 days'`).returning({ id: webhookDeliveries.webhookId })
      return gone.length
    }
  }
}

export type WebhooksRepository = ReturnType<typeof createWebhooksRepository>
