import type { Db } from '../../db/client.js'
import { createKeysRepository } from './keys.repository.js'

/**
 * How often the keys behind open event streams and waiting long-polls are looked up again.
 * The authenticator trusts a key for KEY_CACHE_MS (5 s) at the start of a request; a request
 * that stays open is checked against the database itself this often, so a revocation, an
 * expiry or a deactivation ends it within this plus one query, on every instance.
 */
export const KEY_WATCH_MS = 1_000
/** Key ids per look-up: a bounded statement however many keys hold streams. */
const IDS_PER_QUERY = 1_000

/** The scope a watched request needs to go on: read for feeds and exports, admin for an admin's export. */
type WatchedScope = 'read' | 'admin'

/**
 * Keeps requests that outlive their authentication honest. `watch(keyId, onRefused, scope)`
 * calls `onRefused` once, within KEY_WATCH_MS of the key being revoked, expiring, losing that
 * scope (read by default) or its user being deactivated (one query a tick, a scope, for every
 * key watched in this process).
 * Reads of the feed carry the key's check themselves (keyMayRead), so what the watch has not yet
 * noticed is never sent either.
 */
export function createKeyWatch (db: Db, intervalMs = KEY_WATCH_MS, onError: (err: unknown) => void = () => {}) {
  const keys = createKeysRepository(db)
  // By scope, then key id.
  const watchers = new Map<WatchedScope, Map<string, Set<() => void>>>([['read', new Map()], ['admin', new Map()]])
  const watchedCount = () => watchers.get('read')!.size + watchers.get('admin')!.size
  let timer: NodeJS.Timeout | undefined
  let checking = false

  async function acceptedOf (ids: string[], scope: WatchedScope): Promise<Set<string>> {
    const found = new Set<string>()
    for (let i = 0; i < ids.length; i += IDS_PER_QUERY) {
      for (const id of await keys.accepted(ids.slice(i, i + IDS_PER_QUERY), scope)) found.add(id)
    }
    return found
  }

  async function tick (): Promise<void> {
    if (checking || watchedCount() === 0) return
    checking = true
    try {
      for (const [scope, byKey] of watchers) {
        if (byKey.size === 0) continue
        const ids = [...byKey.keys()]
        const alive = await acceptedOf(ids, scope)
        for (const id of ids) {
          if (alive.has(id)) continue
          const set = byKey.get(id)
          byKey.delete(id)
          for (const refused of set ?? []) refused()
        }
      }
    } catch (err) {
      // The database is unreachable: whatever is open finds out on its own next read.
      onError(err)
    } finally {
      checking = false
      if (watchedCount() === 0) stopTimer()
    }
  }

  function stopTimer (): void {
    clearInterval(timer)
    timer = undefined
  }

  return {
    watch (keyId: string, onRefused: () => void, scope: WatchedScope = 'read'): () => void {
      const byKey = watchers.get(scope)!
      let set = byKey.get(keyId)
      if (set === undefined) byKey.set(keyId, set = new Set())
      // A function of its own per call, so one holder's unwatch never removes another's.
      const entry = () => onRefused()
      set.add(entry)
      if (timer === undefined) {
        timer = setInterval(() => { void tick() }, intervalMs)
        timer.unref()
      }
      return () => {
        const current = byKey.get(keyId)
        current?.delete(entry)
        if (current?.size === 0) byKey.delete(keyId)
        if (watchedCount() === 0) stopTimer()
      }
    },

    /** Keys watched now, counted once a scope (metrics, tests). */
    get watched (): number {
      return watchedCount()
    },

    stop (): void {
      for (const byKey of watchers.values()) byKey.clear()
      stopTimer()
    }
  }
}

export type KeyWatch = ReturnType<typeof createKeyWatch>
