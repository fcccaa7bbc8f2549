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

/**
 * Keeps requests that outlive their authentication honest. `watch(keyId, onRefused)` calls
 * `onRefused` once, within KEY_WATCH_MS of the key being revoked, expiring, losing its read
 * scope or its user being deactivated (one query a tick for every key watched in this process).
 * Reads of the feed carry the key's check themselves (keyMayRead), so what the watch has not yet
 * noticed is never sent either.
 */
export function createKeyWatch (db: Db, intervalMs = KEY_WATCH_MS, onError: (err: unknown) => void = () => {}) {
  const keys = createKeysRepository(db)
  const watchers = new Map<string, Set<() => void>>()
  let timer: NodeJS.Timeout | undefined
  let checking = false

  async function readableOf (ids: string[]): Promise<Set<string>> {
    const found = new Set<string>()
    for (let i = 0; i < ids.length; i += IDS_PER_QUERY) {
      for (const id of await keys.readable(ids.slice(i, i + IDS_PER_QUERY))) found.add(id)
    }
    return found
  }

  async function tick (): Promise<void> {
    if (checking || watchers.size === 0) return
    checking = true
    try {
      const ids = [...watchers.keys()]
      const alive = await readableOf(ids)
      for (const id of ids) {
        if (alive.has(id)) continue
        const set = watchers.get(id)
        watchers.delete(id)
        for (const refused of set ?? []) refused()
      }
    } catch (err) {
      // The database is unreachable: whatever is open finds out on its own next read.
      onError(err)
    } finally {
      checking = false
      if (watchers.size === 0) stopTimer()
    }
  }

  function stopTimer (): void {
    clearInterval(timer)
    timer = undefined
  }

  return {
    watch (keyId: string, onRefused: () => void): () => void {
      let set = watchers.get(keyId)
      if (set === undefined) watchers.set(keyId, set = new Set())
      // A function of its own per call, so one holder's unwatch never removes another's.
      const entry = () => onRefused()
      set.add(entry)
      if (timer === undefined) {
        timer = setInterval(() => { void tick() }, intervalMs)
        timer.unref()
      }
      return () => {
        const current = watchers.get(keyId)
        current?.delete(entry)
        if (current?.size === 0) watchers.delete(keyId)
        if (watchers.size === 0) stopTimer()
      }
    },

    /** Keys watched now (metrics, tests). */
    get watched (): number {
      return watchers.size
    },

    stop (): void {
      watchers.clear()
      stopTimer()
    }
  }
}

export type KeyWatch = ReturnType<typeof createKeyWatch>
