import type { FastifyBaseLogger } from 'fastify'
import type { Db } from '../../db/client.js'
import { loggableError, sqlState } from '../../db/errors.js'
import { createSettingsRepository } from '../../db/settings.repository.js'
import { transaction } from '../../db/transaction.js'
import { rest } from '../../rest.js'
import { createAuditRepository } from '../audit/audit.repository.js'
import { createEventsRepository } from '../events/events.repository.js'
import { createAttachmentChunksRepository } from '../messages/attachment-chunks.repository.js'
import { purgeExpiredMessages } from '../messages/delete.service.js'
import { createIdempotencyRepository } from '../messages/idempotency.repository.js'
import { createQuotaRepository } from '../quota/quota.repository.js'
import { createWebhooksRepository } from '../webhooks/webhooks.repository.js'

const EVERY_MS = 10 * 60 * 1000
// "parley retention": one instance at a time does the sweep.
const RETENTION_LOCK_KEY = 0x70726574
/** SQLSTATE of a lock wait past its lock_timeout. */
const LOCK_NOT_AVAILABLE = '55P03'
/** Audit entries deleted per statement (and transaction): a backlog goes in steps, never in one long delete. */
export const AUDIT_PURGE_BATCH = 1000
/** AUDIT_RETENTION_DAYS' default, for callers without a configuration. */
const DEFAULT_AUDIT_RETENTION_DAYS = 365
/**
 * Messages purged per transaction, with their files, deliveries, events, reactions and
 * metadata: a batch locks and deletes a bounded number of rows, so requests that touch them wait
 * for one short transaction at most, and a kill loses one batch's work, which the next sweep does.
 */
export const MESSAGE_PURGE_BATCH = 500
/** The longest rest between two message batches (the rest is as long as the batch took). */
const MAX_REST_MS = 1_000

export interface RetentionResult {
  ran: boolean
  events: number
  auditEntries: number
  /** Messages purged (MESSAGE_RETENTION_DAYS, groups' own retention). */
  messages: number
}

interface RetentionOptions {
  /** MESSAGE_RETENTION_DAYS; undefined: only groups with a retention of their own lose messages. */
  messageRetentionDays?: number | undefined
  /** Purge at most this many message batches in this sweep; the next sweep goes on from there. */
  maxMessageBatches?: number
  /** Rest between message batches as long as each took (at most a second), leaving the database to other work half the time. */
  rest?: boolean
  /** Stops the message purge between two batches (shutdown). */
  signal?: AbortSignal
}

/**
 * Purges what the contract says is kept only for a while: events every active key of their
 * user has acknowledged (and its webhooks have sent), events the bot took after 7 days, any
 * event after 30, Idempotency-Keys after 24 h, quota counts of past days, upload chunks
 * no send claimed within STAGED_TTL_MS, audit log entries after `auditRetentionDays`, messages
 * past MESSAGE_RETENTION_DAYS or their group's own retention (purgeMessages). Every instance
 * tries on a timer; a transaction-scoped advisory lock keeps sweeps from overlapping, and a
 * row recording the last sweep lets only the first instance of each period do the work.
 */
export async function purgeExpired (
  db: Db, minIntervalMs = 0, auditRetentionDays = DEFAULT_AUDIT_RETENTION_DAYS, options: RetentionOptions = {}
): Promise<RetentionResult> {
  const swept = await transaction(db, async (tx): Promise<RetentionResult> => {
    const settings = createSettingsRepository(tx)
    if (!await settings.tryLock(RETENTION_LOCK_KEY)) return { ran: false, events: 0, auditEntries: 0, messages: 0 }
    if (!await settings.claimEvery('retention_swept', minIntervalMs)) return { ran: false, events: 0, auditEntries: 0, messages: 0 }
    const purged = await createEventsRepository(tx).purge()
    await createIdempotencyRepository(tx).purge()
    await createQuotaRepository(tx).purge()
    // Chunks of uploads that a crash (SIGKILL mid-upload) left unclaimed.
    await createAttachmentChunksRepository(tx).sweep()
    await createWebhooksRepository(tx).purgeLog()
    const auditEntries = await createAuditRepository(tx).purge(auditRetentionDays, AUDIT_PURGE_BATCH)
    return { ran: true, events: purged, auditEntries, messages: 0 }
  })
  if (!swept.ran) return swept
  // The rest of an audit backlog (a first sweep, a shortened AUDIT_RETENTION_DAYS) a batch per
  // transaction, by the instance that claimed this sweep, each under the same lock, so another
  // instance's sweep never overlaps it: many short deletes rather than one long one.
  for (let last = swept.auditEntries; last === AUDIT_PURGE_BATCH && options.signal?.aborted !== true;) {
    last = (await underLock(db, async (tx) => createAuditRepository(tx).purge(auditRetentionDays, AUDIT_PURGE_BATCH), options.signal))?.done ?? 0
    swept.auditEntries += last
  }
  swept.messages = await purgeMessages(db, options)
  return swept
}

/** How long a batch waits for the retention lock, and how many such waits before it leaves the work to whoever holds it. */
const LOCK_WAIT_MS = 2_000
const LOCK_TRIES = 3
const LOCK_RETRY_MS = 100
const READ_COMMITTED = { isolationLevel: 'read committed' } as const

/**
 * `work` in a transaction holding the retention lock, waiting for it: another instance's sweep
 * checking its claim holds it for a moment, and a purge under way must not stop for that (its
 * backlog would wait a whole period). Undefined without doing the work only when the lock stayed
 * held through LOCK_TRIES waits of LOCK_WAIT_MS (another instance purging: it goes on), or
 * `signal` stopped the tries. Read committed whatever the database's default: under repeatable
 * read a batch that waited would work from a snapshot taken before the previous holder's
 * commit, and fail on the rows it had deleted. Answers what `work` did and how long it took,
 * the wait not counted.
 */
async function underLock (db: Db, work: (tx: Db) => Promise<number>, signal?: AbortSignal): Promise<{ done: number, ms: number } | undefined> {
  for (let tries = 1; ; tries++) {
    let locked = false
    try {
      return await transaction(db, async (tx) => {
        await createSettingsRepository(tx).lock(RETENTION_LOCK_KEY, LOCK_WAIT_MS)
        locked = true
        const started = performance.now()
        const done = await work(tx)
        return { done, ms: performance.now() - started }
      }, READ_COMMITTED)
    } catch (err) {
      // A lock_timeout of the work's own (an operator's default) is the work's failure, not a busy lock.
      if (locked || sqlState(err) !== LOCK_NOT_AVAILABLE) throw err
      if (tries >= LOCK_TRIES || signal?.aborted === true) return undefined
      await rest(LOCK_RETRY_MS, signal)
    }
  }
}

/**
 * Messages past their retention, MESSAGE_PURGE_BATCH a transaction, each under the retention
 * lock (so two instances never purge at once, and never the same message), until a batch finds
 * none: the backlog is done, or every message it came to was held by other work (the next sweep
 * takes them); or until another sweep keeps the lock (underLock). A batch that comes back short
 * is not the end: it skips what other work holds (a sealing pass's page, a reaction's fan-out),
 * and ending there left a backlog beside a sealing pass to one batch a sweep, every 10 minutes
 * (retention-kill, 2026-11-29). A kill between batches, or the batch limit, leaves the rest to
 * the next sweep: every batch selects by age afresh.
 */
async function purgeMessages (db: Db, options: RetentionOptions): Promise<number> {
  let total = 0
  for (let batches = 0; batches < (options.maxMessageBatches ?? Infinity) && options.signal?.aborted !== true; batches++) {
    const batch = await underLock(db, async (tx) => purgeExpiredMessages(tx, options.messageRetentionDays, MESSAGE_PURGE_BATCH), options.signal)
    if (batch === undefined) break
    total += batch.done
    if (batch.done === 0) break
    if (options.rest === true) await rest(Math.min(MAX_REST_MS, batch.ms), options.signal)
  }
  return total
}

interface RetentionSettings {
  auditRetentionDays: number
  messageRetentionDays: number | undefined
}

/**
 * The sweep on a timer, every `everyMs` (first 5 s after start). A sweep still purging a
 * backlog when the timer comes round is left to finish rather than joined by another. The
 * function returned stops the timer and the message purge after its current batch, and
 * resolves once the sweep under way (if any) has ended.
 */
export function startRetention (db: Db, log: FastifyBaseLogger, settings: RetentionSettings, everyMs = EVERY_MS): () => Promise<void> {
  const stopping = new AbortController()
  let running: Promise<void> | undefined
  const sweep = () => {
    if (running !== undefined || stopping.signal.aborted) return
    // Slightly under the period, so timer drift never makes every instance skip one.
    running = purgeExpired(db, everyMs * 0.9, settings.auditRetentionDays, {
      messageRetentionDays: settings.messageRetentionDays, rest: true, signal: stopping.signal
    }).then(
      (result) => {
        if (result.ran) log.info({ purgedEvents: result.events, purgedAuditEntries: result.auditEntries, purgedMessages: result.messages }, 'retention sweep')
      },
      (err: unknown) => log.warn({ err: loggableError(err) }, 'retention sweep failed; will retry')
    ).finally(() => { running = undefined })
  }
  const first = setTimeout(sweep, 5_000)
  const timer = setInterval(sweep, everyMs)
  first.unref()
  timer.unref()
  return async () => {
    clearTimeout(first)
    clearInterval(timer)
    stopping.abort()
    await running
  }
}
