import { randomUUID } from 'node:crypto'
import type { FastifyBaseLogger } from 'fastify'
import type { Db } from '../../db/client.js'
import { loggableError } from '../../db/errors.js'
import type { Metrics } from '../../metrics.js'
import type { EventBus } from '../events/event-bus.js'
import { createEventsRepository, toEvent } from '../events/events.repository.js'
import type { EventRow } from '../events/events.table.js'
import type { SecretBox } from './webhook-secrets.js'
import { signature, type WebhookSender } from './webhook-sender.js'
import { createWebhooksRepository, LeaseLost, type Attempt } from './webhooks.repository.js'
import type { WebhookRow } from './webhooks.table.js'

/** Webhooks one instance sends to at once (each one event at a time, in order). */
const CONCURRENCY = 16
/** Webhooks of one user being sent to at once, over every instance: no user takes every slot. */
const PER_USER = 2
/** Events read per batch. */
const BATCH = 100
/**
 * How long a claimed webhook is this instance's. A batch starts no delivery after BATCH_MS,
 * and one delivery takes at most DELIVERY_TIMEOUT_MS (10 s), so the lease outlives the batch;
 * after a crash another instance (or the restarted one) takes over when it runs out.
 */
const LEASE_MS = 30_000
const BATCH_MS = 10_000
/** During a batch, whether the webhook may still deliver is looked up again this often. */
const RECHECK_MS = 1_000
/** Due retries and missed notifications are looked for this often. */
const POLL_MS = 1_000
/** Which addresses have webhooks is re-read this often (other instances create them too). */
const REFRESH_MS = 5_000
/** API.md §9: retried for 24 h, then disabled. */
const GIVE_UP_AFTER_MS = 24 * 60 * 60 * 1000
const MAX_BACKOFF_MS = 60 * 60 * 1000

export interface DispatcherOptions {
  db: Db
  bus: EventBus
  sender: WebhookSender
  secrets: SecretBox
  log: FastifyBaseLogger
  metrics: Metrics
  /** How long the head event may keep failing before the webhook is disabled (tests shorten it). */
  giveUpAfterMs?: number
}

/**
 * The wait before trying a failing event again: about as long as it has been failing, so the
 * waits double (1 s, 2 s, 4 s … an hour at most), with ±20 % jitter so that many webhooks
 * failing together do not retry in step.
 */
export function backoffMs (failingForMs: number, random = Math.random): number {
  return Math.round(Math.min(MAX_BACKOFF_MS, Math.max(1_000, failingForMs)) * (0.8 + 0.4 * random()))
}

/**
 * Whether the webhook wants this event: its filter, and not a typing indicator that has lapsed.
 * No filter (events null, the default) means every type but typing.* (API.md §9, §13): a
 * webhook that wants typing lists those types. Webhooks registered before this rule with no
 * filter keep it too, and stop receiving typing, as the documented default always said.
 */
function wanted (webhook: WebhookRow, event: EventRow, now: number): boolean {
  if (webhook.events === null ? event.type.startsWith('typing.') : !webhook.events.includes(event.type)) return false
  return event.expiresAt === null || event.expiresAt.getTime() > now
}

/**
 * Delivers each user's feed to their webhooks: woken by the event bus when a feed with a
 * webhook grows, and every second for due retries. Webhooks are claimed with FOR UPDATE SKIP
 * LOCKED and a lease, so instances share them and none is sent by two at once.
 */
export function createWebhookDispatcher ({ db, bus, sender, secrets, log, metrics, giveUpAfterMs = GIVE_UP_AFTER_MS }: DispatcherOptions) {
  const repository = createWebhooksRepository(db)
  const active = new Map<string, Promise<void>>()
  // Whether delivery keeps going: sweeps that stop growing are a dispatcher stuck; batches
  // always at CONCURRENCY, receivers too slow for the slots.
  const countSweep = metrics.counter('parley_webhook_sweeps_total', 'Looks for due webhooks this instance made (each second, and when a watched feed grows)')
  const countBatch = metrics.counter('parley_webhook_batches_total', 'Webhook batches this instance started: a claimed webhook sent its events in order')
  metrics.gauge('parley_webhook_batches_active', `Webhook batches running on this instance (at most ${CONCURRENCY})`, () => [{ value: active.size }])
  // Users with a batch in flight here: their notifications need no tick (the batch reads on).
  const busy = new Map<string, number>()
  let watched = new Set<string>()
  let ticking = false
  let again = false
  let closing = false
  let timers: NodeJS.Timeout[] = []
  let unwatch: (() => void) | undefined

  async function post (webhook: WebhookRow, event: EventRow): Promise<Attempt> {
    const body = JSON.stringify(toEvent(event))
    const at = new Date()
    let secret: string
    try {
      secret = secrets.open(webhook.id, webhook.secret)
    } catch (err) {
      return { eventId: event.seq, at, delivered: false, error: `not sent: ${(err as Error).message}` }
    }
    const outcome = await sender.post(webhook.url, body, {
      'content-type': 'application/json',
      'x-parley-event-id': String(event.seq),
      'x-parley-webhook-id': webhook.id,
      'x-parley-signature': signature(secret, body, at)
    })
    return { eventId: event.seq, at, ...outcome }
  }

  /**
   * Delivers for a claimed webhook, round after round while events keep coming (within
   * BATCH_MS): each round reads up to BATCH events (redeliveries first, then the feed), sends
   * them in order until one fails, and records how far it got, renewing the lease; the last
   * round gives the lease back.
   */
  async function deliver (claimed: WebhookRow): Promise<void> {
    const started = Date.now()
    // Its key revoked or expired, or its user deactivated, since the claim: stop sending.
    let refused = false
    let checkedAt = 0
    const accepted = async (): Promise<boolean> => {
      refused = !await repository.deliverable(claimed.id)
      checkedAt = Date.now()
      return !refused
    }
    const more = () => !closing && !refused && Date.now() - started <= BATCH_MS
    // Before each delivery, when the last look is RECHECK_MS old: a round of slow receivers
    // stops within that (plus one delivery) of a revocation, not at the end of its 10 s batch.
    const mayPost = async () => more() && (Date.now() - checkedAt < RECHECK_MS || await accepted())
    let webhook = claimed
    for (;;) {
      const { redeliveries, feed } = await repository.nextEvents(webhook, BATCH)
      // Asked after the read: nothing committed after a revocation or deactivation goes out.
      if (!await accepted()) {
        await repository.release(webhook)
        return
      }
      const attempts: Attempt[] = []
      const redelivered: { eventId: number, markedAt: Date }[] = []
      let through = webhook.deliveredThrough
      let failed: Attempt | undefined
      for (const { event, markedAt } of redeliveries) {
        if (!await mayPost()) break
        const attempt = await post(webhook, event)
        if (!attempt.delivered && closing) break
        attempts.push(attempt)
        if (!attempt.delivered) { failed = attempt; break }
        redelivered.push({ eventId: event.seq, markedAt })
      }
      for (const event of failed === undefined ? feed : []) {
        if (!more()) break
        if (!wanted(webhook, event, Date.now())) { through = event.seq; continue }
        if (!await mayPost()) break
        const attempt = await post(webhook, event)
        // Cut off by shutdown: not the receiver's failure; the next holder sends it again.
        if (!attempt.delivered && closing) break
        attempts.push(attempt)
        if (!attempt.delivered) { failed = attempt; break }
        through = event.seq
      }

      if (failed === undefined) {
        // Another round while this one found work and time remains; else let go (due at once,
        // so the next tick claims it again if more has come).
        const again = redeliveries.length + feed.length > 0 && more()
        await repository.record(webhook, attempts, { deliveredThrough: through, redelivered, nextAttemptAt: new Date(), failingSince: null }, again ? LEASE_MS : undefined)
        if (!again) return
        webhook = { ...webhook, deliveredThrough: through, failingSince: null }
        continue
      }
      const progressed = through > webhook.deliveredThrough || redelivered.length > 0
      const failingSince = progressed || webhook.failingSince === null ? failed.at : webhook.failingSince
      const failingFor = failed.at.getTime() - failingSince.getTime()
      log.info({ webhook: webhook.id, event: failed.eventId, error: failed.error }, 'webhook delivery failed; will retry')
      const progress = { deliveredThrough: through, redelivered, nextAttemptAt: new Date(failed.at.getTime() + backoffMs(failingFor)), failingSince }
      if (failingFor < giveUpAfterMs) {
        await repository.record(webhook, attempts, progress)
        return
      }
      log.warn({ webhook: webhook.id, event: failed.eventId, error: failed.error }, 'webhook disabled: its deliveries kept failing')
      await repository.record(webhook, attempts, progress, undefined, async (tx) => {
        await createEventsRepository(tx).append([{ address: webhook.address, type: 'webhook.disabled', data: { webhook: webhook.id } }])
      })
      return
    }
  }

  /** Claims what is due, up to the free slots, and starts each batch; runs again while asked to. */
  async function tick (): Promise<void> {
    if (closing) return
    if (ticking) { again = true; return }
    ticking = true
    try {
      do {
        again = false
        const free = CONCURRENCY - active.size
        if (free <= 0) break
        for (const webhook of await repository.claimDue(free, LEASE_MS, randomUUID(), PER_USER)) {
          // Shutting down, or a batch of ours still runs on it (its lease ran out): let it go.
          if (closing || active.has(webhook.id)) { await repository.release(webhook); continue }
          busy.set(webhook.address, (busy.get(webhook.address) ?? 0) + 1)
          countBatch()
          active.set(webhook.id, deliver(webhook)
            .catch((err: unknown) => {
              if (err instanceof LeaseLost) log.info({ webhook: webhook.id }, 'webhook lease lost to another claim; stopped sending')
              else log.warn({ err: loggableError(err), webhook: webhook.id }, 'webhook batch failed; its lease runs out and it is tried again')
            })
            .finally(() => {
              active.delete(webhook.id)
              const left = (busy.get(webhook.address) ?? 1) - 1
              if (left === 0) busy.delete(webhook.address)
              else busy.set(webhook.address, left)
              void tick()
            }))
        }
        countSweep()
      } while (again && !closing)
    } catch (err) {
      log.warn({ err: loggableError(err) }, 'could not claim webhooks; will retry')
    } finally {
      ticking = false
    }
  }

  async function refresh (): Promise<void> {
    watched = new Set(await repository.watchedAddresses())
  }

  return {
    start (): void {
      closing = false
      unwatch = bus.watchAll((addresses) => {
        // Most sends have nobody's webhook to wake, and a feed whose batch is in flight is read
        // on by that batch; a lost connection (no addresses) might have missed anything.
        if (addresses.length === 0 || addresses.some((a) => watched.has(a) && !busy.has(a))) void tick()
      })
      const refreshing = () => { refresh().catch((err: unknown) => log.warn({ err: loggableError(err) }, 'could not read which users have webhooks')) }
      refreshing()
      // Secrets stored before a key was configured are sealed now.
      if (secrets.sealing) {
        repository.sealUnsealed((id, secret) => secrets.seal(id, secret)).then(
          (sealed) => { if (sealed > 0) log.info({ sealed }, 'sealed webhook signing secrets stored before WEBHOOK_SECRETS_KEY was set') },
          (err: unknown) => log.warn({ err: loggableError(err) }, 'could not seal stored webhook secrets; will try at the next start')
        )
      }
      timers = [setInterval(() => { void tick() }, POLL_MS), setInterval(refreshing, REFRESH_MS)]
      for (const timer of timers) timer.unref()
    },

    /** A webhook made or removed here: watch its user's feed at once. */
    watch (address: string): void {
      watched.add(address)
      void tick()
    },

    /** Stops claiming, cuts off deliveries in flight, and waits for their batches to record. */
    async stop (): Promise<void> {
      closing = true
      unwatch?.()
      for (const timer of timers) clearInterval(timer)
      sender.close()
      await Promise.allSettled([...active.values()])
    }
  }
}

export type WebhookDispatcher = ReturnType<typeof createWebhookDispatcher>
