import { inArray, lt, sql } from 'drizzle-orm'
import type { Db } from '../../db/client.js'
import { queryRows } from '../../db/rows.js'
import { quotaUsage } from './quota.table.js'

export interface QuotaState { limit: number, used: number, resetAt: number }

export function quotaHeaders (state: QuotaState): Record<string, string> {
  return {
    'x-quota-limit': String(state.limit),
    'x-quota-remaining': String(Math.max(0, state.limit - state.used)),
    'x-quota-reset': String(state.resetAt)
  }
}

export function createQuotaRepository (db: Db) {
  return {
    /**
     * A key's count today and when today ends (epoch seconds), both by the database's clock in
     * UTC, as a send counts them: never this instance's clock, which may differ.
     */
    async today (keyId: string): Promise<{ used: number, resetAt: number }> {
      const [row] = await queryRows<{ used: number, reset_at: string | number }>(db, sql`
        SELECT coalesce((SELECT count FROM ${quotaUsage} WHERE key_id = ${keyId} AND day = (now() AT TIME ZONE 'UTC')::date), 0)::int AS used,
          extract(epoch FROM date_trunc('day', now() AT TIME ZONE 'UTC') + interval '1 day')::bigint AS reset_at`)
      return { used: row!.used, resetAt: Number(row!.reset_at) }
    },

    /** Erasure: every count of these keys. */
    async forget (keyIds: string[]): Promise<void> {
      if (keyIds.length > 0) await db.delete(quotaUsage).where(inArray(quotaUsage.keyId, keyIds))
    },

    /** Forgets days long past. */
    async purge (): Promise<void> {
      await db.delete(quotaUsage).where(lt(quotaUsage.day, sql`(now() at time zone 'utc')::date - 2`))
    }
  }
}
