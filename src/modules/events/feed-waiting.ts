import type { KeyWatch } from '../keys/key-watch.js'
import type { EventBus, Subscription } from './event-bus.js'

/** setTimeout's largest delay: a longer one fires at once. */
const FOREVER_MS = 2_147_483_647

/**
 * The reason a follower's signal is aborted with when its client goes away: one AbortError for
 * all, as `abort()` without a reason builds a new one, with its stack, for every connection that
 * closes (about 150 ms of the server's busy time at 19,700 connections; nothing reads the reason).
 */
export const CLIENT_GONE: DOMException = Object.freeze(new DOMException('the client went away', 'AbortError'))

export interface FollowOptions<T> {
  /**
   * Reads the feed: what it found, or undefined when there is nothing (yet). Called with the
   * feed's subscription already made, so whatever commits after it began is either in what it
   * read or wakes the wait that follows. It may throw: following ends with the error.
   */
  read: () => Promise<T | undefined>
  /** A wait without notification reads the feed again after this long anyway (a lost NOTIFY). */
  safetyMs?: number
  /** When following ends (ms since the epoch), with a wait that runs to it. */
  until?: number
  /** Following ends when this aborts (the client went away, the caller stopped); a wait in progress ends at once. */
  signal?: AbortSignal
  /**
   * The key the caller reads with: following ends within KEY_WATCH_MS of it being revoked,
   * expiring or losing its read scope, or its user deactivated (on any instance), and calls
   * `refused` at once, while the caller may still be busy with what it read.
   */
  keyId?: string
  refused?: () => void
}

/**
 * Waiting on a feed, in one place: long-polls (GET /events with wait), event streams and the
 * test bot. `hold` counts what waits per key; `follow` reads, and waits on the event bus
 * between reads that find nothing.
 */
export function createFeedWaiting ({ bus, keyWatch, maxPerKey }: { bus: EventBus, keyWatch: KeyWatch, maxPerKey: number }) {
  // The places each API key holds in waits on its feed, long-polls and event streams together
  // (MAX_LONG_POLLS_PER_KEY in this process): each holds a socket and a timer, so one key must
  // not hoard them.
  const held = new Map<string, number>()

  return {
    /**
     * One of the key's waiting places, and the way to give it back (once, however often
     * called), or undefined when the key holds all of its places.
     */
    hold (keyId: string): (() => void) | undefined {
      const now = held.get(keyId) ?? 0
      if (now >= maxPerKey) return undefined
      held.set(keyId, now + 1)
      let given = false
      return () => {
        if (given) return
        given = true
        const left = (held.get(keyId) ?? 1) - 1
        if (left <= 0) held.delete(keyId)
        else held.set(keyId, left)
      }
    },

    /** The bus is stopping (shutdown): every follow has ended, or ends at once. */
    get closing (): boolean {
      return bus.closing
    },

    /**
     * Yields what each read of `address`'s feed finds, reading again at once after each, and
     * waiting on the bus between reads that find nothing: until `until`, `signal` aborts, the
     * key is refused, or the bus closes (shutdown: a wait would return at once and only spin).
     * The caller acts on each page inside its loop (and may move its own `after` on for the
     * next read); breaking out of the loop ends the following.
     */
    async * follow<T> (address: string, { read, safetyMs, until, signal, keyId, refused }: FollowOptions<T>): AsyncGenerator<T, void, undefined> {
      let current: Subscription | undefined
      let keyRefused = false
      const cancel = () => current?.cancel()
      const ended = () => bus.closing || keyRefused || signal?.aborted === true || (until !== undefined && Date.now() >= until)
      signal?.addEventListener('abort', cancel)
      // Watched for the whole of the following, reads included: what a read finds after a
      // revocation is nothing (each read carries the key's check), and the watch ends the wait.
      const unwatch = keyId === undefined
        ? undefined
        : keyWatch.watch(keyId, () => {
          keyRefused = true
          cancel()
          refused?.()
        })
      // Woken by the last wait: the feed is read once more even at `until` or shutdown (the
      // wake-up may be the event that came in its last moment), not after an abort or a refusal.
      let woken = false
      try {
        while (!ended() || (woken && !keyRefused && signal?.aborted !== true)) {
          woken = false
          // Subscribe before each read, so an event committed between the read and the wait still wakes us.
          const subscription = bus.subscribe(address)
          current = subscription
          const page = await read()
          if (page !== undefined) {
            subscription.cancel()
            yield page
            continue
          }
          if (ended()) break
          const left = until === undefined ? FOREVER_MS : until - Date.now()
          const ms = Math.min(safetyMs ?? FOREVER_MS, left)
          woken = await subscription.wait(ms)
          subscription.cancel()
          // Ran to `until`: nothing came (a wait may end a millisecond early by the clock).
          if (!woken && ms === left) break
        }
      } finally {
        // Also after a read that throws (a full gate queue, its client gone, the database): its
        // subscription must not stay behind in the bus until that feed's next event.
        current?.cancel()
        unwatch?.()
        signal?.removeEventListener('abort', cancel)
      }
    }
  }
}

export type FeedWaiting = ReturnType<typeof createFeedWaiting>
