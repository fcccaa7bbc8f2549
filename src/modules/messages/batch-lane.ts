/**
 * A batch goes beside one already in flight only when this many items wait, or when the one in
 * flight has taken SECOND_BATCH_AFTER_MS (it may wait on a row lock, say a user row held by a
 * group change, and must not hold every other key's sends behind it). Measured at 10
 * connections: one batch at a time 3,115-3,182 sends/s, two 2,693-2,755 (smaller batches, more
 * commits); at 50, where the queue is long, the second batch keeps PostgreSQL busy while Node
 * answers the first.
 */
const SECOND_BATCH_QUEUE = 16
const SECOND_BATCH_AFTER_MS = 20

interface BatchLaneOptions<T> {
  /** Items one batch takes at most. */
  maxBatch: number
  /** Batches in flight at once, each on its own connection (PGlite has one: 1). */
  concurrency: number
  /**
   * Whether `item` may join `batch`, the items the batch being formed has taken so far. Never
   * asked of a batch's first item, the oldest waiting, which always goes: so the lane always
   * moves. An item refused keeps its place for the next batch.
   */
  canJoin: (item: T, batch: readonly T[]) => boolean
  /**
   * Writes a batch and answers its items; never rejects. Its slot is freed by `written` (called
   * once its statement has answered) or else when it ends.
   */
  write: (batch: T[], written: () => void) => Promise<void>
  /**
   * Told how long each item waited in the queue for its batch to start ('queued', once an
   * item), and how long each batch's statement took to answer ('statement', once a batch).
   */
  observe?: (stage: LaneStage, seconds: number) => void
}

/** Where a queued item spends its time before it is answered (metrics, bench:profile). */
export type LaneStage = 'queued' | 'statement'

/**
 * A queue and its batches in flight: commit coalescing. An item waits for a free batch slot;
 * items that arrive while `concurrency` batches are in flight queue up and are written together
 * by the next one, oldest first, so many share one commit. Under light load an item finds a
 * slot free and goes at once, alone, so coalescing adds no wait.
 */
export function createBatchLane<T> (options: BatchLaneOptions<T>): { add (item: T): void } {
  const { maxBatch, concurrency, canJoin, write, observe } = options
  // Items waiting, oldest first, each with when it was added.
  const queue: { item: T, at: number }[] = []
  // When each batch in flight started.
  const inFlight = new Set<number>()
  let recheck: NodeJS.Timeout | undefined

  function pump (): void {
    while (inFlight.size < concurrency && queue.length > 0) {
      if (inFlight.size > 0 && queue.length < SECOND_BATCH_QUEUE) {
        const waited = performance.now() - Math.min(...inFlight)
        if (waited < SECOND_BATCH_AFTER_MS) {
          recheck ??= setTimeout(() => {
            recheck = undefined
            pump()
          }, SECOND_BATCH_AFTER_MS - waited)
          return
        }
      }
      const entries = takeBatch()
      const now = performance.now()
      let started = now
      while (inFlight.has(started)) started += 1e-6
      inFlight.add(started)
      if (observe !== undefined) for (const { at } of entries) observe('queued', (now - at) / 1000)
      // The slot is freed as soon as the batch's statement has answered, before its requests
      // are answered, so the next batch is in PostgreSQL while this one's replies are written.
      const free = (): void => {
        if (!inFlight.delete(started)) return
        observe?.('statement', (performance.now() - now) / 1000)
        pump()
      }
      write(entries.map((e) => e.item), free).finally(free)
    }
  }

  /** The next batch, oldest first: up to maxBatch items, each after the first as canJoin lets it. */
  function takeBatch (): { item: T, at: number }[] {
    const entries = queue.splice(0, 1)
    const batch = entries.map((e) => e.item)
    for (let i = 0; i < queue.length && batch.length < maxBatch;) {
      const entry = queue[i]!
      if (!canJoin(entry.item, batch)) {
        i++
        continue
      }
      entries.push(entry)
      batch.push(entry.item)
      queue.splice(i, 1)
    }
    return entries
  }

  return {
    add (item: T): void {
      queue.push({ item, at: performance.now() })
      pump()
    }
  }
}
