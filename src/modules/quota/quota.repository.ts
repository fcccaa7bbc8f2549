import { and, eq, lt, sql } from 'drizzle-orm'
import type { Db } from '../../db/client.js'
import { AppError } from '../../errors.js'
import { quotaUsage } from './quota.table.js'

/** The UTC day a moment counts against, as YYYY-MM-DD. */
export function utcDay (now: Date): string {
  return now.toISOString().slice(0, 10)
}

/** Epoch seconds of the next UTC midnight: when today's count resets. */
export function nextUtcMidnight (now: Date): number {
  return Math.floor(Date.UTC(now.getUTCFullYear(), now.getUTCMonth(), now.getUTCDate() + 1) / 1000)
}

export interface QuotaState { limit: number, used: number, resetAt: number }

export function quotaHeaders (state: QuotaState): Record<string, string> {
  return {
    'x-quota-limit': String(state.limit),
    'x-quota-remaining': String(Math.max(0, state.limit - state.used)),
    'x-quota-reset': String(state.resetAt)
  }
}

export class QuotaExceeded extends AppError {
  constructor (state: QuotaState) {
    super(429, 'QUOTA_EXCEEDED', `Daily message quota of ${state.limit} reached; contact the operator for higher volume`, {
      ...quotaHeaders(state),
      'retry-after': String(Math.max(1, state.resetAt - Math.floor(Date.now() / 1000)))
    })
  }
}

export function createQuotaRepository (db: Db) {
  return {
    async used (keyId: string, day: string): Promise<number> {
      const [row] = await db.select({ count: quotaUsage.count }).from(quotaUsage)
        .where(and(eq(quotaUsage.keyId, keyId), eq(quotaUsage.day, day)))
      return row?.count ?? 0
    },

    /** Forgets days long past. */
    async purge (): Promise<void> {
      await db.delete(quotaUsage).where(lt(quotaUsage.day, sql`(now() at time zone 'utc')::date - 2`))
    }
  }
}
