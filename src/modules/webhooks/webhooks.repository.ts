import { and, asc, desc, eq, gt, inArray, isNotNull, isNull, lt, lte, sql, type SQL } from 'drizzle-orm'
import type { Db } from '../../db/client.js'
import { queryRows } from '../../db/rows.js'
import { transaction } from '../../db/transaction.js'
import { events, type EventRow } from '../events/events.table.js'
import { apiKeys } from '../keys/keys.table.js'
import { users } from '../users/users.table.js'
import type { AdminWebhook, Webhook, WebhookDelivery } from './webhooks.schemas.js'
import { webhookDeliveries, webhooks, type WebhookDeliveryRow, type WebhookRow } from './webhooks.table.js'

/**
 * Whether webhook `w` may deliver now: its user is not deactivated, and the key that registered
 * it is accepted (not revoked, not expired by the database's clock, with the read scope that
 * managing webhooks needs); a webhook from before keys were recorded (no key) needs one such
 * key of its user. Evaluated by the claim and again during a batch, so a revocation, expiry or
 * deactivation stops deliveries on every instance.
 */
const deliverable = (w: SQL) => sql`NOT EXISTS (SELECT 1 FROM ${users} u WHERE u.address = ${w}.address AND u.deactivated_at IS NOT NULL)
  AND EXISTS (SELECT 1 FROM ${apiKeys} k
    WHERE (k.id = ${w}.key_id OR (${w}.key_id IS NULL AND k.address = ${w}.address))
      AND k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > now()) AND 'read' = ANY(k.scopes))`

/** A webhook as its owner sees it: never with its secret. */
export function toWebhook (w: WebhookRow): Webhook {
  return { id: w.id, url: w.url, events: w.events, createdAt: w.createdAt.toISOString(), disabledAt: w.disabledAt?.toISOString() ?? null }
}

export function toAdminWebhook (w: WebhookRow): AdminWebhook {
  return { ...toWebhook(w), address: w.address, keyId: w.keyId }
}

export function toWebhookDelivery (d: WebhookDeliveryRow): WebhookDelivery {
  return { event: String(d.eventId), status: d.status, attempts: d.attempts, lastError: d.lastError, lastAttemptAt: d.lastAttemptAt?.toISOString() ?? null }
}

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
  /** Redeliveries done with (delivered), whose mark is cleared if it is still the one read. */
  redelivered: { eventId: number, markedAt: Date }[]
  nextAttemptAt: Date
  /** Set while the head event keeps failing; null once it is delivered. */
  failingSince: Date | null
}

/** A holder's lease ran out and another claim took the webhook: it must stop, recording nothing. */
export class LeaseLost extends Error {
  constructor (webhookId: string) {
    super(`the lease on ${webhookId} was lost to another claim`)
    this.name = 'LeaseLost'
  }
}

export function createWebhooksRepository (db: Db) {
  return {
    /**
     * A new webhook, delivering the events its user's feed gains from now on; undefined when
     * the user already has `max` webhooks. The user's row is locked first, so that two creates
     * at once count one after the other (the count runs in a statement of its own, which sees
     * what the other committed).
     */
    async create (w: { id: string, address: string, keyId: string, url: string, events: string[] | null, secret: string }, max: number): Promise<WebhookRow | undefined> {
      return transaction(db, async (tx) => {
        await tx.execute(sql`SELECT 1 FROM users WHERE address = ${w.address} FOR NO KEY UPDATE`)
        const [row] = await queryRows<{ id: string }>(tx, sql`
          INSERT INTO ${webhooks} (id, address, key_id, url, events, secret, delivered_through)
          SELECT ${w.id}, address, ${w.keyId}, ${w.url}, ${w.events === null ? null : sql`${sql.param(w.events)}::text[]`}, ${w.secret}, event_seq
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

    /** One page of a user's webhooks by id (ids grow with time), after `after`: the admin's list. */
    async page (address: string, after: string | undefined, limit: number): Promise<WebhookRow[]> {
      return db.select().from(webhooks)
        .where(and(eq(webhooks.address, address), after === undefined ? undefined : gt(webhooks.id, after)))
        .orderBy(asc(webhooks.id))
        .limit(limit)
    },

    /** Whether the webhook is there, not disabled, and may deliver now (see deliverable). */
    async deliverable (id: string): Promise<boolean> {
      const [row] = await queryRows<{ id: string }>(db, sql`
        SELECT w.id FROM ${webhooks} w WHERE w.id = ${id} AND w.disabled_at IS NULL AND ${deliverable(sql`w`)}`)
      return row !== undefined
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

    /** Erasure: deletes every webhook of the user and their delivery logs; answers how many. */
    async removeAllOf (address: string): Promise<number> {
      const gone = await db.delete(webhooks).where(eq(webhooks.address, address)).returning({ id: webhooks.id })
      return gone.length
    },

    /** One page of a webhook's delivery log, newest event first. */
    async deliveries (id: string, limit: number, before: number | undefined): Promise<WebhookDeliveryRow[]> {
      return db.select().from(webhookDeliveries)
        .where(and(eq(webhookDeliveries.webhookId, id), before === undefined ? undefined : lt(webhookDeliveries.eventId, before)))
        .orderBy(desc(webhookDeliveries.eventId))
        .limit(limit)
    },

    /**
     * Asks for an event to be sent again, before the feed's next one. A mark on an event the
     * webhook has not yet been through waits until it has (nextEvents takes only marks at or
     * below deliveredThrough), so the event goes out in its turn and once more after, never
     * ahead of earlier events. False when the feed no longer holds the event (or never did). A
     * webhook waiting out a failure's backoff is not made due sooner.
     */
    async markRedelivery (webhook: WebhookRow, eventId: number): Promise<boolean> {
      const [marked] = await queryRows<{ webhook_id: string }>(db, sql`
        WITH marked AS (
          INSERT INTO ${webhookDeliveries} (webhook_id, event_id, status, redeliver)
          SELECT ${webhook.id}, seq, 'pending', now() FROM ${events} WHERE address = ${webhook.address} AND seq = ${eventId}
          ON CONFLICT (webhook_id, event_id) DO UPDATE SET redeliver = now(), status = 'pending'
          RETURNING webhook_id),
        due AS (
          UPDATE ${webhooks} SET next_attempt_at = now()
          WHERE id IN (SELECT webhook_id FROM marked) AND failing_since IS NULL AND next_attempt_at > now())
        SELECT webhook_id FROM marked`)
      return marked !== undefined
    },

    /**
     * Leases up to `limit` webhooks that have something to send and are due, for `leaseMs`,
     * under `token`: FOR UPDATE SKIP LOCKED and the lease keep any other instance off them until
     * the lease is released or runs out (a crashed holder's work is taken over then: at least
     * once). A user holds at most `perUser` leases at once, counting every instance's, so one
     * user's slow receivers cannot take every delivery slot.
     *
     * The cap is applied before the window, in the statement: each user's due webhooks are
     * ranked, and only those its held leases leave room for are read. Applied after a window
     * of the oldest due rows (as it was), five users with slow receivers and many webhooks
     * filled the window with webhooks they could not take, so free slots sat idle while
     * everyone else's webhooks waited for their batches to end (p99 25 s).
     */
    async claimDue (limit: number, leaseMs: number, token: string, perUser: number): Promise<WebhookRow[]> {
      const ids = await transaction(db, async (tx) => {
        const due = await queryRows<{ id: string, address: string, leased: number }>(tx, sql`
          WITH ready AS (
            SELECT w.id, w.address, w.next_attempt_at,
              row_number() OVER (PARTITION BY w.address ORDER BY w.next_attempt_at, w.id) AS rank
            FROM ${webhooks} w
            WHERE w.disabled_at IS NULL AND w.next_attempt_at <= now() AND (w.lease_until IS NULL OR w.lease_until < now())
              AND ${deliverable(sql`w`)}
              AND (EXISTS (SELECT 1 FROM ${events} e WHERE e.address = w.address AND e.seq > w.delivered_through)
                OR EXISTS (SELECT 1 FROM ${webhookDeliveries} d JOIN ${events} e ON e.address = w.address AND e.seq = d.event_id
                           WHERE d.webhook_id = w.id AND d.redeliver IS NOT NULL AND d.event_id <= w.delivered_through))
          ), leased AS (
            SELECT l.address, count(*)::int AS n FROM ${webhooks} l
            WHERE l.lease_until >= now() AND l.address IN (SELECT address FROM ready) GROUP BY l.address
          )
          SELECT w.id, w.address, coalesce(leased.n, 0) AS leased
          FROM ready JOIN ${webhooks} w ON w.id = ready.id LEFT JOIN leased ON leased.address = ready.address
          WHERE coalesce(leased.n, 0) + ready.rank <= ${perUser}
            -- Checked again on the locked row: another claim may have leased it since ready read it.
            AND w.disabled_at IS NULL AND w.next_attempt_at <= now() AND (w.lease_until IS NULL OR w.lease_until < now())
          ORDER BY ready.next_attempt_at, ready.id
          LIMIT ${limit}
          FOR UPDATE OF w SKIP LOCKED`)
        const held = new Map<string, number>()
        const chosen: string[] = []
        for (const row of due) {
          const n = held.get(row.address) ?? row.leased
          if (n >= perUser || chosen.length >= limit) continue
          held.set(row.address, n + 1)
          chosen.push(row.id)
        }
        if (chosen.length > 0) {
          await tx.update(webhooks).set({ leaseUntil: sql`now() + make_interval(secs => ${leaseMs / 1000})`, leaseToken: token })
            .where(inArray(webhooks.id, chosen))
        }
        return chosen
      })
      if (ids.length === 0) return []
      return db.select().from(webhooks).where(inArray(webhooks.id, ids))
    },

    /**
     * The events to send next, in order: redeliveries (of events the webhook has been through)
     * first, then the feed after deliveredThrough. A mark whose event the feed no longer holds
     * is dropped.
     */
    async nextEvents (webhook: WebhookRow, limit: number): Promise<{ redeliveries: { event: EventRow, markedAt: Date }[], feed: EventRow[] }> {
      await db.execute(sql`
        UPDATE ${webhookDeliveries} d SET redeliver = NULL
        WHERE d.webhook_id = ${webhook.id} AND d.redeliver IS NOT NULL
          AND NOT EXISTS (SELECT 1 FROM ${events} e WHERE e.address = ${webhook.address} AND e.seq = d.event_id)`)
      const redeliveries = await db.select({ event: events, markedAt: webhookDeliveries.redeliver }).from(webhookDeliveries)
        .innerJoin(events, and(eq(events.address, webhook.address), eq(events.seq, webhookDeliveries.eventId)))
        .where(and(eq(webhookDeliveries.webhookId, webhook.id), isNotNull(webhookDeliveries.redeliver), lte(webhookDeliveries.eventId, webhook.deliveredThrough)))
        .orderBy(asc(webhookDeliveries.eventId))
        .limit(limit)
      const feed = await db.select().from(events)
        .where(and(eq(events.address, webhook.address), gt(events.seq, webhook.deliveredThrough)))
        .orderBy(asc(events.seq))
        .limit(limit)
      return { redeliveries: redeliveries.map((r) => ({ event: r.event, markedAt: r.markedAt! })), feed }
    },

    /**
     * Records a round in one transaction, if this claim still holds the lease (LeaseLost
     * otherwise, and nothing is written): each attempt in the log (lastError is the last error
     * an event met, kept once it is delivered), the webhook's progress, and the lease released
     * (or renewed for `renewLeaseMs`, when another round follows). With `disable`, the webhook
     * is disabled and its owner told, in the same transaction (`disable` runs inside it).
     */
    async record (webhook: WebhookRow, attempts: Attempt[], progress: Progress, renewLeaseMs?: number, disable?: (tx: Db) => Promise<void>): Promise<void> {
      await transaction(db, async (tx) => {
        const [held] = await tx.update(webhooks).set({
          deliveredThrough: sql`GREATEST(${webhooks.deliveredThrough}, ${progress.deliveredThrough})`,
          nextAttemptAt: progress.nextAttemptAt,
          failingSince: progress.failingSince,
          leaseUntil: renewLeaseMs === undefined ? null : sql`now() + make_interval(secs => ${renewLeaseMs / 1000})`,
          leaseToken: renewLeaseMs === undefined ? null : webhook.leaseToken,
          ...(disable !== undefined ? { disabledAt: sql`now()` } : {})
        }).where(and(eq(webhooks.id, webhook.id), eq(webhooks.leaseToken, webhook.leaseToken ?? ''))).returning({ id: webhooks.id })
        if (held === undefined) throw new LeaseLost(webhook.id)
        // One row per event (the last attempt of a round wins).
        const last = [...new Map(attempts.map((a) => [a.eventId, a])).values()]
        if (last.length > 0) {
          const rows = sql.join(last.map((a) => sql`(${webhook.id}::text, ${a.eventId}::bigint, ${a.delivered ? 'delivered' : disable !== undefined ? 'failed' : 'pending'}::text, ${a.error}::text, ${a.at.toISOString()}::timestamptz)`), sql`, `)
          await tx.execute(sql`
            INSERT INTO ${webhookDeliveries} (webhook_id, event_id, status, attempts, last_error, last_attempt_at)
            SELECT v.webhook_id, v.event_id, v.status, 1, v.last_error, v.at FROM (VALUES ${rows}) AS v(webhook_id, event_id, status, last_error, at)
            ON CONFLICT (webhook_id, event_id) DO UPDATE SET status = excluded.status, attempts = ${webhookDeliveries}.attempts + 1,
              last_error = COALESCE(excluded.last_error, ${webhookDeliveries}.last_error), last_attempt_at = excluded.last_attempt_at`)
        }
        // Only the marks this round read: a redelivery asked for meanwhile stays.
        for (const r of progress.redelivered) {
          await tx.update(webhookDeliveries).set({ redeliver: null })
            .where(and(eq(webhookDeliveries.webhookId, webhook.id), eq(webhookDeliveries.eventId, r.eventId), eq(webhookDeliveries.redeliver, r.markedAt)))
        }
        if (disable !== undefined) await disable(tx)
      })
    },

    /** The users with a webhook that is not disabled: whose feeds the dispatcher watches. */
    async watchedAddresses (): Promise<string[]> {
      const rows = await db.selectDistinct({ address: webhooks.address }).from(webhooks).where(isNull(webhooks.disabledAt))
      return rows.map((r) => r.address)
    },

    /** Seals every secret stored unsealed (once a key is configured); how many it sealed. */
    async sealUnsealed (seal: (webhookId: string, secret: string) => string): Promise<number> {
      const rows = await db.select({ id: webhooks.id, secret: webhooks.secret }).from(webhooks).where(sql`${webhooks.secret} NOT LIKE 'sealed:%'`)
      for (const row of rows) {
        await db.update(webhooks).set({ secret: seal(row.id, row.secret) }).where(and(eq(webhooks.id, row.id), eq(webhooks.secret, row.secret)))
      }
      return rows.length
    },

    /** Gives a lease back without progress (shutdown), if this claim still holds it. */
    async release (webhook: WebhookRow): Promise<void> {
      await db.update(webhooks).set({ leaseUntil: null, leaseToken: null })
        .where(and(eq(webhooks.id, webhook.id), eq(webhooks.leaseToken, webhook.leaseToken ?? '')))
    },

    /** Retention: the log of events the feed no longer holds. */
    async purgeLog (): Promise<number> {
      const gone = await db.delete(webhookDeliveries)
        .where(sql`COALESCE(${webhookDeliveries.lastAttemptAt}, ${webhookDeliveries.redeliver}) < now() - interval '30 days'`)
        .returning({ id: webhookDeliveries.webhookId })
      return gone.length
    }
  }
}
