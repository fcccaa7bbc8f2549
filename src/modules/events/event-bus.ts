import type { Database } from '../../db/client.js'
import { EVENTS_CHANNEL, NEWCOMER_RECHECK_MS } from './announcements.repository.js'

export interface Subscription {
  /**
   * Resolves true when the feed may have grown (or the bus is stopping), false when `ms` ran
   * out first or the subscription was cancelled.
   */
  wait(ms: number): Promise<boolean>
  cancel(): void
}

/**
 * Wakes whoever waits on a feed (long-polls, event streams, the test bot) when any instance
 * commits an event to it, and tells watchAll's watchers (webhook delivery) of every feed that
 * grew. One LISTEN connection per process, however many wait; a waiter subscribes before it
 * reads the feed, so an event committed between its read and its wait still wakes it (each
 * waiter on a feed does so through feed-waiting.ts's follow).
 */
export function createEventBus (database: Database) {
  const waiting = new Map<string, Set<() => void>>()
  // Whoever hears of every feed (webhook delivery): called with the addresses, or with none
  // after the connection was lost (anything may have grown).
  const watchers = new Set<(addresses: string[]) => void>()
  let stopListening: (() => Promise<void>) | undefined
  let closing = false
  let recheck: NodeJS.Timeout | undefined

  function wake (address: string): void {
    const set = waiting.get(address)
    if (set === undefined) return
    waiting.delete(address)
    for (const fn of set) fn()
  }

  function wakeAll (): void {
    for (const address of [...waiting.keys()]) wake(address)
  }

  /** Every waiter and watcher reads again: anything may have grown. */
  function lookAgain (): void {
    wakeAll()
    tell([])
  }

  /** Every watcher hears of `addresses`; one that throws costs the others nothing. */
  function tell (addresses: string[]): void {
    for (const watch of watchers) {
      try { watch(addresses) } catch {}
    }
  }

  /**
   * Once more after NEWCOMER_RECHECK_MS: another instance that was alone on the database may
   * have told only itself of what grew meanwhile (announcements.repository.ts).
   */
  function recheckLater (): void {
    clearTimeout(recheck)
    recheck = setTimeout(lookAgain, NEWCOMER_RECHECK_MS).unref()
  }

  return {
    async start (): Promise<void> {
      // Notifications sent while the connection was down are lost: let every waiter re-read.
      stopListening = await database.listen(EVENTS_CHANNEL, (payload) => {
        const addresses = payload.split(',')
        for (const address of addresses) wake(address)
        tell(addresses)
      }, () => {
        lookAgain()
        recheckLater()
      })
      recheckLater()
    },

    /**
     * Wakes every waiter now (a long-poll answers what it has, a stream ends) and refuses to
     * wait from here on: a subscription made after this resolves at once (shutdown).
     */
    async stop (): Promise<void> {
      closing = true
      clearTimeout(recheck)
      wakeAll()
      const stop = stopListening
      stopListening = undefined
      // A database already gone has dropped the listener with it.
      await stop?.().catch(() => {})
    },

    get closing (): boolean {
      return closing
    },

    /** Calls `watch` whenever any feed may have grown; returns the way to stop. */
    watchAll (watch: (addresses: string[]) => void): () => void {
      watchers.add(watch)
      return () => { watchers.delete(watch) }
    },

    subscribe (address: string): Subscription {
      let settle: ((woken: boolean) => void) | undefined
      let woken = closing
      // Cancelled (the client went away): a wait from here on ends at once. A wait begun after
      // its cancel used to run its whole course, so a closed stream kept its per-key place for
      // the stream's 30 s safety wait.
      let cancelled = false
      let timer: NodeJS.Timeout | undefined
      const notify = () => {
        woken = true
        settle?.(true)
      }
      const detach = () => {
        clearTimeout(timer)
        const set = waiting.get(address)
        set?.delete(notify)
        if (set?.size === 0) waiting.delete(address)
      }
      if (!closing) {
        let set = waiting.get(address)
        if (set === undefined) waiting.set(address, set = new Set())
        set.add(notify)
      }
      return {
        // A wait in progress ends (not woken) rather than hanging forever.
        cancel: () => {
          cancelled = true
          detach()
          settle?.(false)
        },
        wait: (ms) => new Promise<boolean>((resolve) => {
          if (woken || cancelled || ms <= 0) {
            detach()
            resolve(woken)
            return
          }
          settle = (value) => {
            settle = undefined
            detach()
            resolve(value)
          }
          timer = setTimeout(() => settle?.(false), ms)
        })
      }
    }
  }
}

export type EventBus = ReturnType<typeof createEventBus>
