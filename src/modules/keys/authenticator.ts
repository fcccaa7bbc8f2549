import type { Db } from '../../db/client.js'
import { createGatheredLookups } from '../../gathered-lookups.js'
import { createKeysRepository, type KeyForAuth } from './keys.repository.js'
import { isScope, type Scope } from '../../scopes.js'
import { secretMatches } from './secrets.js'

/** Who a verified request acts as. */
export interface Principal {
  keyId: string
  address: string
  /** The key's daily message quota: its own override, else the configured default. */
  dailyQuota: number
  scopes: Scope[]
}

// What a key id can look like: the service issues `key_` and 26 letters and digits, but keys
// written by other tools (an import, a benchmark's fixtures) may carry any short name of the
// same alphabet. Anything else is refused without a lookup.
const KEY_ID = /^key_[0-9a-z_]{1,64}$/
// Compared against when the id is unknown; no secret hashes to it (it is not a SHA-256 of anything known).
const UNKNOWN_KEY_HASH = '0'.repeat(64)

/** How often one process records that a key was used: a write per key a minute at most. */
const LAST_USED_EVERY_MS = 60_000

/** How long a key read from the database is trusted: a revocation or quota change lands within this. */
export const KEY_CACHE_MS = 5_000
const MAX_CACHED_KEYS = 10_000
/** The most key ids one look-up statement carries, and one lastUsedAt write. */
const LOOKUPS_PER_STATEMENT = 100
const TOUCHES_PER_STATEMENT = 500

/**
 * How long a key id that authenticated stays known to the process after its last success, so
 * that while its network is throttled for failed authentications (a flood of made-up ids from
 * the same address) it still reaches the database when its cache entry runs out.
 */
export const KNOWN_KEY_MS = 10 * 60_000

// An unknown id is cached too (as undefined): ids are random, so none can be tried before it is issued.
interface Cached { row: KeyForAuth | undefined, until: number }

/**
 * Verifies key id and secret against the stored hash. What a lookup found, a key or nothing,
 * is cached for at most KEY_CACHE_MS: a busy key costs one query per 5 s, and an unknown id
 * costs exactly what a known one does (one lookup, then the cache, then the same hash and
 * constant-time comparison), so timing does not tell which ids exist. A new key is never in
 * the cache as unknown: its random id cannot have been tried before it was issued.
 */
export function createAuthenticator (db: Db, defaultDailyQuota: number, now: () => number = Date.now, onError: (err: unknown) => void = () => {}) {
  const keys = createKeysRepository(db)
  const lookups = createGatheredLookups((ids) => keys.findManyForAuth(ids), LOOKUPS_PER_STATEMENT)
  const cache = new Map<string, Cached>()
  // Counts clear()s: a look-up that began before one (it may have read a key as it was before
  // this process changed it) answers its own request but is not cached.
  let clears = 0
  const lastTouched = new Map<string, number>()
  // Key ids by their last successful authentication, oldest first.
  const verifiedAt = new Map<string, number>()

  function verified (keyId: string): void {
    verifiedAt.delete(keyId)
    if (verifiedAt.size >= MAX_CACHED_KEYS) verifiedAt.delete(verifiedAt.keys().next().value!)
    verifiedAt.set(keyId, now())
  }

  // Keys used this turn whose lastUsedAt is to be written, in one statement at the turn's end.
  let touching = new Set<string>()

  function writeTouches (): void {
    const ids = [...touching]
    touching = new Set()
    for (let i = 0; i < ids.length; i += TOUCHES_PER_STATEMENT) keys.touch(ids.slice(i, i + TOUCHES_PER_STATEMENT)).catch(onError)
  }

  /**
   * lastUsedAt, written in the background and at most once a minute per key, the keys of one
   * turn together: with thousands of keys connected, a statement each was a thousand a minute.
   */
  function touch (keyId: string): void {
    const at = now()
    if ((lastTouched.get(keyId) ?? -Infinity) > at - LAST_USED_EVERY_MS) return
    if (lastTouched.size >= MAX_CACHED_KEYS) lastTouched.clear()
    lastTouched.set(keyId, at)
    if (touching.size === 0) setImmediate(writeTouches)
    touching.add(keyId)
  }

  async function lookup (keyId: string): Promise<KeyForAuth | undefined> {
    const hit = cache.get(keyId)
    if (hit !== undefined && hit.until > now()) return hit.row
    const began = clears
    const row = await lookups.find(keyId)
    if (began !== clears) return row
    if (cache.size >= MAX_CACHED_KEYS) cache.delete(cache.keys().next().value!)
    cache.set(keyId, { row, until: now() + KEY_CACHE_MS })
    return row
  }

  return {
    async authenticate (keyId: string, secret: string): Promise<Principal | undefined> {
      // Not a key id this service issues: refused without asking the database.
      if (!KEY_ID.test(keyId)) return undefined
      const row = await lookup(keyId)
      // An unknown id costs the same hash and comparison as a wrong secret.
      const matches = secretMatches(secret, row?.secretHash ?? UNKNOWN_KEY_HASH)
      if (row === undefined || !matches) return undefined
      if (row.revokedAt !== null || row.userDeactivatedAt !== null) return undefined
      if (row.expiresAt !== null && row.expiresAt.getTime() <= now()) return undefined
      touch(row.id)
      verified(row.id)
      return { keyId: row.id, address: row.address, dailyQuota: row.dailyQuota ?? defaultDailyQuota, scopes: row.scopes.filter(isScope) }
    },
    /** Whether answering for this id needs no database lookup now. */
    isCached (keyId: string): boolean {
      const hit = cache.get(keyId)
      return hit !== undefined && hit.until > now()
    },
    /**
     * Whether this id is worth a lookup from a network throttled for failed authentications:
     * it is cached (no lookup at all), or it authenticated here within KNOWN_KEY_MS.
     */
    isKnown (keyId: string): boolean {
      return this.isCached(keyId) || (verifiedAt.get(keyId) ?? -Infinity) > now() - KNOWN_KEY_MS
    },
    /** Forgets cached keys (tests, and after this process changes a key itself). */
    clear (): void {
      clears++
      // Requests from now on look their keys up anew, not with a statement already on its way.
      lookups.reset()
      cache.clear()
      lastTouched.clear()
      verifiedAt.clear()
    }
  }
}

export type Authenticator = ReturnType<typeof createAuthenticator>
