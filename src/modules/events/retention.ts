import type { FastifyBaseLogger } from 'fastify'
import { lte, sql } from 'drizzle-orm'
import type { Db } from '../../db/client.js'
import { queryRows } from '../../db/rows.js'
import { idempotencyKeys } from '../messages/idempotency.table.js'
import { createQuotaRepository } from '../quota/quota.repository.js'
import { createEventsRepository } from './events.repository.js'

const EVERY_MS = 10 * 60 * 1000
// "parley retention": one instance at a time does the sweep.
const RETENTION_LOCK_KEY = 0x70726574

/**
 * Purges what the contract says is kept only for a while: acknowledged events after 7 days,
 * any event after 30, Idempotency-Keys after 24 h, quota counts of past days. Each instance
 * runs it periodically; a transaction-scoped advisory lock lets one sweep run at a time, and
 * each sweep is idempotent, so several instances need no coordination beyond that.
 */
export async function purgeExpired (db: Db): Promise<{ ran: boolean, events: number }> {
  return db.transaction(async (tx) => {
    const [lock] = await queryRows<{ locked: boolean }>(tx, sql`SELECT pg_try_advisory_xact_lock(${RETENTION_LOCK_KEY}) AS locked`)
    if (lock?.locked !== true) return { ran: false, events: 0 }
    const purged = await createEventsRepository(tx).purge()
    await tx.delete(idempotencyKeys).where(lte(idempotencyKeys.createdAt, sql`now() - interval '24 hours'`))
    await createQuotaRepository(tx).purge()
    return { ran: true, events: purged }
  })
}

export function startRetention (db: Db, log: FastifyBaseLogger, everyMs = EVERY_MS): () => void {
  const sweep = () => {
    purgeExpired(db).then(
      (result) => { if (result.events > 0) log.info({ purgedEvents: result.events }, 'retention sweep') },
      (err: unknown) => log.warn({ err }, 'retention sweep failed; will retry')
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
