import type { FastifyBaseLogger } from 'fastify'
import type { Db } from '../../db/client.js'
import { loggableError } from '../../db/errors.js'
import { createSettingsRepository } from '../../db/settings.repository.js'
import { transaction } from '../../db/transaction.js'
import { createAuditRepository } from '../audit/audit.repository.js'
import { createEventsRepository } from '../events/events.repository.js'
import { createAttachmentChunksRepository } from '../messages/attachment-chunks.repository.js'
import { createIdempotencyRepository } from '../messages/idempotency.repository.js'
import { createQuotaRepository } from '../quota/quota.repository.js'
import { createWebhooksRepository } from '../webhooks/webhooks.repository.js'

const EVERY_MS = 10 * 60 * 1000
// "parley retention": one instance at a time does the sweep.
const RETENTION_LOCK_KEY = 0x70726574
/** Audit entries deleted per statement (and transaction): a backlog goes in steps, never in one long delete. */
export const AUDIT_PURGE_BATCH = 1000
/** AUDIT_RETENTION_DAYS' default, for callers without a configuration. */
const DEFAULT_AUDIT_RETENTION_DAYS = 365

export interface RetentionResult {
  ran: boolean
  events: number
  auditEntries: number
}

/**
 * Purges what the contract says is kept only for a while: events every active key of their
 * user has acknowledged (and its webhooks have sent), events the bot took after 7 days, any
 * event after 30, Idempotency-Keys after 24 h, quota counts of past days, upload chunks
 * no send claimed within STAGED_TTL_MS, audit log entries after `auditRetentionDays`. Every instance
 * tries on a timer; a transaction-scoped advisory lock keeps sweeps from overlapping, and a
 * row recording the last sweep lets only the first instance of each period do the work.
 */
export async function purgeExpired (db: Db, minIntervalMs = 0, auditRetentionDays = DEFAULT_AUDIT_RETENTION_DAYS): Promise<RetentionResult> {
  const swept = await transaction(db, async (tx): Promise<RetentionResult> => {
    const settings = createSettingsRepository(tx)
    if (!await settings.tryLock(RETENTION_LOCK_KEY)) return { ran: false, events: 0, auditEntries: 0 }
    if (!await settings.claimEvery('retention_swept', minIntervalMs)) return { ran: false, events: 0, auditEntries: 0 }
    const purged = await createEventsRepository(tx).purge()
    await createIdempotencyRepository(tx).purge()
    await createQuotaRepository(tx).purge()
    // Chunks of uploads that a crash (SIGKILL mid-upload) left unclaimed.
    await createAttachmentChunksRepository(tx).sweep()
    await createWebhooksRepository(tx).purgeLog()
    const auditEntries = await createAuditRepository(tx).purge(auditRetentionDays, AUDIT_PURGE_BATCH)
    return { ran: true, events: purged, auditEntries }
  })
  // The rest of an audit backlog (a first sweep, a shortened AUDIT_RETENTION_DAYS) a batch per
  // transaction, by the instance that claimed this sweep, each under the same lock, so another
  // instance's sweep never overlaps it: many short deletes rather than one long one.
  for (let last = swept.auditEntries; swept.ran && last === AUDIT_PURGE_BATCH;) {
    last = await transaction(db, async (tx) => await createSettingsRepository(tx).tryLock(RETENTION_LOCK_KEY)
      ? createAuditRepository(tx).purge(auditRetentionDays, AUDIT_PURGE_BATCH)
      : 0)
    swept.auditEntries += last
  }
  return swept
}

export function startRetention (db: Db, log: FastifyBaseLogger, auditRetentionDays: number, everyMs = EVERY_MS): () => void {
  const sweep = () => {
    // Slightly under the period, so timer drift never makes every instance skip one.
    purgeExpired(db, everyMs * 0.9, auditRetentionDays).then(
      (result) => { if (result.ran) log.info({ purgedEvents: result.events, purgedAuditEntries: result.auditEntries }, 'retention sweep') },
      (err: unknown) => log.warn({ err: loggableError(err) }, 'retention sweep failed; will retry')
    )
  }
  const first = setTimeout(sweep, 5_000)
  const timer = setInterval(sweep, everyMs)
  first.unref()
  timer.unref()
  return () => {
    clearTimeout(first)
    clearInterval(timer)
  }
}
