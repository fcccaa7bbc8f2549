import type { PageRead } from './events.repository.js'
import type { EventRow } from './events.table.js'

export interface FeedReadsOptions {
  /** The most distinct reads one statement serves: what one statement may answer is this many pages. */
  perStatement: number
  /** The most of these statements running at once (each holds a connection while it runs). */
  inFlight: number
}

/**
 * Keyed page reads of feeds on the primary (event streams, long-polls), gathered into
 * statements: a NOTIFY wakes every connection waiting on the feeds it names at once (a message
 * to a group of 1,000 members whose clients all wait, or the five streams of one user), and
 * each then reads its feed. One statement each was one round trip, one plan and one backend's
 * turn per connection: at 5,000 connections those reads were most of a wake-up's cost
 * (bench:connections). Reads asked for in one turn of the event loop, or while `inFlight`
 * statements run, go out together (`pages`: events.pages(), one statement), `perStatement` to
 * a statement; each answers what events.page() would have answered at the statement's moment,
 * which is after the read was asked for (so whatever woke it is in it). A failed statement
 * fails every read it carried.
 */
export function createFeedReads (pages: (reads: PageRead[]) => Promise<EventRow[][]>, { perStatement, inFlight }: FeedReadsOptions) {
  interface Pending {
    read: PageRead
    resolve: (rows: EventRow[]) => void
    reject: (err: unknown) => void
  }
  let queue: Pending[] = []
  let running = 0
  let scheduled = false

  const schedule = () => {
    if (scheduled || queue.length === 0 || running >= inFlight) return
    scheduled = true
    // After this turn's other reads have joined the queue (a NOTIFY's waiters wake in one turn).
    setImmediate(flush)
  }

  /**
   * The next statement's reads, taken from the front of the queue: `perStatement` distinct
   * reads at most. The same read asked for by several connections (a user's streams and
   * long-polls with one key, each as far as the last event) is read once and its rows shared
   * (readers only read them).
   */
  function take (): { reads: PageRead[], waiting: Pending[][] } {
    const unique = new Map<string, number>()
    const reads: PageRead[] = []
    const waiting: Pending[][] = []
    let taken = 0
    for (; taken < queue.length; taken++) {
      const pending = queue[taken]!
      const { read } = pending
      const key = `${read.keyId} ${read.address} ${read.after} ${read.limit} ${read.maxBytes}`
      const place = unique.get(key)
      if (place !== undefined) {
        waiting[place]!.push(pending)
        continue
      }
      if (reads.length === perStatement) break
      unique.set(key, reads.length)
      reads.push(read)
      waiting.push([pending])
    }
    queue = taken === queue.length ? [] : queue.slice(taken)
    return { reads, waiting }
  }

  function flush () {
    scheduled = false
    while (queue.length > 0 && running < inFlight) {
      running++
      void run(take())
    }
  }

  async function run ({ reads, waiting }: { reads: PageRead[], waiting: Pending[][] }) {
    try {
      const answers = await pages(reads)
      waiting.forEach((all, i) => { for (const p of all) p.resolve(answers[i]!) })
    } catch (err) {
      for (const all of waiting) for (const p of all) p.reject(err)
    } finally {
      running--
      schedule()
    }
  }

  return {
    /** events.page(address, after, limit, maxBytes, keyId), read with others waiting now. */
    page (read: PageRead): Promise<EventRow[]> {
      return new Promise<EventRow[]>((resolve, reject) => {
        queue.push({ read, resolve, reject })
        schedule()
      })
    }
  }
}

export type FeedReads = ReturnType<typeof createFeedReads>
