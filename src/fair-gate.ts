/** Thrown by FairGate.enter when a key already has as many requests waiting as it may. */
export class QueueFull extends Error { override name = 'QueueFull' }

/** Thrown by FairGate.enter when the caller gave up (its client went away) while it waited. */
export class Abandoned extends Error { override name = 'Abandoned' }

interface Waiter { admit: (leave: () => void) => void, refuse: (err: Error) => void }

export interface FairGateOptions {
  /** Holders at once, over all keys. */
  capacity: number
  /** Holders at once for one key. */
  perKey: number
  /** Waiters one key may queue; past it enter() throws QueueFull at once. */
  maxQueuedPerKey: number
}

/**
 * A counting semaphore that is fair between keys: each key holds at most `perKey` places and
 * all keys together `capacity`; when a place frees, the keys with waiters take turns (round
 * robin), so a key with a hundred requests queued delays another key's one request by at most
 * one turn, never by the whole backlog. Waiters hold nothing: no connection, no lock.
 */
export class FairGate {
  private held = 0
  private readonly heldByKey = new Map<string, number>()
  // Keys with waiters, in turn order: a key served goes to the back (Map keeps insertion order).
  private readonly queues = new Map<string, Waiter[]>()

  private readonly options: FairGateOptions

  constructor (options: FairGateOptions) {
    this.options = options
  }

  /** Places held now, and requests waiting for one: for /metrics. */
  stats (): { held: number, waiting: number } {
    let waiting = 0
    for (const queue of this.queues.values()) waiting += queue.length
    return { held: this.held, waiting }
  }

  /**
   * Resolves with `leave` once the key may go ahead; call it exactly once when done. Rejects
   * with QueueFull when the key's queue is full, and with Abandoned when `gone` fires first.
   */
  enter (key: string, gone?: (cancel: () => void) => void): Promise<() => void> {
    // Waiters of other keys are there only because their own key is at its limit: no turn to wait for.
    if (!this.queues.has(key) && this.mayHold(key)) return Promise.resolve(this.take(key))
    const queue = this.queues.get(key) ?? []
    if (queue.length >= this.options.maxQueuedPerKey) return Promise.reject(new QueueFull())
    return new Promise((resolve, reject) => {
      const waiter: Waiter = { admit: resolve, refuse: reject }
      queue.push(waiter)
      this.queues.set(key, queue)
      gone?.(() => {
        const at = queue.indexOf(waiter)
        if (at < 0) return
        queue.splice(at, 1)
        if (queue.length === 0) this.queues.delete(key)
        reject(new Abandoned())
      })
      this.pump()
    })
  }

  private mayHold (key: string): boolean {
    return this.held < this.options.capacity && (this.heldByKey.get(key) ?? 0) < this.options.perKey
  }

  private take (key: string): () => void {
    this.held++
    this.heldByKey.set(key, (this.heldByKey.get(key) ?? 0) + 1)
    let left = false
    return () => {
      if (left) return
      left = true
      this.held--
      const mine = (this.heldByKey.get(key) ?? 1) - 1
      if (mine === 0) this.heldByKey.delete(key)
      else this.heldByKey.set(key, mine)
      this.pump()
    }
  }

  private pump (): void {
    let admitted = true
    while (admitted && this.held < this.options.capacity) {
      admitted = false
      for (const [key, queue] of this.queues) {
        if (!this.mayHold(key)) continue
        const waiter = queue.shift()!
        this.queues.delete(key)
        // Served: to the back of the turn order, if it still waits.
        if (queue.length > 0) this.queues.set(key, queue)
        waiter.admit(this.take(key))
        admitted = true
        break
      }
    }
  }
}
