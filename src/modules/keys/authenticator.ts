import type { Db } from '../../db/client.js'
import type { ApiKeyRow } from './keys.table.js'
import { createKeysRepository } from './keys.repository.js'
import { secretMatches } from './secrets.js'

/** Who a verified request acts as. */
export interface Principal {
  keyId: string
  address: string
  /** The key's daily message quota: its own override, else the configured default. */
  dailyQuota: number
}

/** How long a key read from the database is trusted: a revocation or quota change lands within this. */
export const KEY_CACHE_MS = 5_000
const MAX_CACHED_KEYS = 10_000

interface Cached { row: ApiKeyRow, until: number }

/**
 * Verifies key id and secret against the stored hash. Keys found are cached for at most
 * KEY_CACHE_MS so a busy key costs one query per 5 s; unknown ids are not cached, so a key
 * created a moment ago works at once.
 */
export function createAuthenticator (db: Db, defaultDailyQuota: number, now: () => number = Date.now) {
  const keys = createKeysRepository(db)
  const cache = new Map<string, Cached>()

  async function lookup (keyId: string): Promise<ApiKeyRow | undefined> {
    const hit = cache.get(keyId)
    if (hit !== undefined && hit.until > now()) return hit.row
    const row = await keys.findForAuth(keyId)
    if (row === undefined) {
      cache.delete(keyId)
      return undefined
    }
    if (cache.size >= MAX_CACHED_KEYS) cache.delete(cache.keys().next().value!)
    cache.set(keyId, { row, until: now() + KEY_CACHE_MS })
    return row
  }

  return {
    async authenticate (keyId: string, secret: string): Promise<Principal | undefined> {
      if (keyId.length === 0 || keyId.length > 64) return undefined
      const row = await lookup(keyId)
      if (row === undefined || row.revokedAt !== null) return undefined
      if (!secretMatches(secret, row.secretHash)) return undefined
      return { keyId: row.id, address: row.address, dailyQuota: row.dailyQuota ?? defaultDailyQuota }
    },
    /** Forgets cached keys (tests, and after this process changes a key itself). */
    clear (): void {
      cache.clear()
    }
  }
}

export type Authenticator = ReturnType<typeof createAuthenticator>
