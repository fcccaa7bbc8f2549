import { sql } from 'drizzle-orm'
import type { Db } from '../../db/client.js'
import { queryPrepared } from '../../db/rows.js'
import { afterCommit } from '../../db/transaction.js'

/** The channel a NOTIFY names the feeds that grew on (event-bus.ts listens). */
export const EVENTS_CHANNEL = 'parley_events'
/**
 * Addresses to one NOTIFY, comma-separated: 100 of at most 64 characters stay under the 8,000
 * bytes PostgreSQL allows a payload.
 */
const ADDRESSES_PER_NOTIFY = 100
/**
 * How long an announcement is waited for: past it, the next one goes on another connection of
 * the pool (a connection that hangs must not silence every later announcement of the process).
 */
const ANNOUNCE_TIMEOUT_MS = 5_000
/** How long shutdown waits for the announcements still to go out before the database closes. */
const SETTLE_MS = 2_000

/**
 * Why announcing waits for the commit, in a statement of its own: PostgreSQL gives every
 * transaction that NOTIFYs a cluster-wide lock (PreCommit_Notify, on "database 0") and holds it
 * until the commit is over, WAL flush included. Writers that notified in their own statements
 * therefore committed one at a time, a flush each, whatever their keys: on a disk whose flushes
 * take milliseconds, one key appending tens of thousands of events a second (reactions in a large
 * group) held every other key's send behind its flushes. The announcement's own transaction
 * writes nothing but its notifications and does not wait for its flush (synchronous_commit off:
 * a notification is not durable anyway), so it holds the lock for microseconds.
 *
 * The addresses of everything committed in one turn of the event loop go out together, one
 * announcement at a time per database, so notifying costs at most one connection of the pool.
 * A lost announcement (its statement failed, or the process died between a commit and it) delays
 * no waiter for long: every wait re-reads its feed at least every 30 s (feed-waiting.ts), and a
 * lost LISTEN connection wakes them all.
 */
interface Announcer {
  pending: Set<string>
  /** The announcements under way, until none is left to make. */
  running: Promise<void> | undefined
  onError: (err: unknown, addresses: number) => void
}

const announcers = new WeakMap<Db, Announcer>()

function announcerOf (root: Db): Announcer {
  let announcer = announcers.get(root)
  if (announcer === undefined) announcers.set(root, announcer = { pending: new Set(), running: undefined, onError: () => {} })
  return announcer
}

/** The statement: every payload NOTIFYd, in a transaction that does not wait for its flush. */
function announcement (payloads: string[]) {
  return sql`SELECT set_config('synchronous_commit', 'off', true),
    (SELECT count(pg_notify(${EVENTS_CHANNEL}, p)) FROM unnest(${sql.param(payloads)}::text[]) AS p) AS notified`
}

async function announce (root: Db, addresses: string[]): Promise<void> {
  const payloads: string[] = []
  for (let i = 0; i < addresses.length; i += ADDRESSES_PER_NOTIFY) payloads.push(addresses.slice(i, i + ADDRESSES_PER_NOTIFY).join(','))
  let timer: NodeJS.Timeout | undefined
  const timedOut = new Promise<never>((_resolve, reject) => {
    timer = setTimeout(() => reject(new Error(`no answer to an announcement within ${ANNOUNCE_TIMEOUT_MS} ms`)), ANNOUNCE_TIMEOUT_MS)
  })
  const made = queryPrepared(root, announcement(payloads))
  made.catch(() => {}) // answered after its timeout: nobody waits for it any more
  try {
    await Promise.race([made, timedOut])
  } finally {
    clearTimeout(timer)
  }
}

/** Makes announcements, one at a time, while feeds wait to be announced; then frees the way. */
function schedule (root: Db, announcer: Announcer): void {
  if (announcer.running !== undefined) return
  announcer.running = new Promise<void>((resolve) => setImmediate(resolve)).then(async () => {
    while (announcer.pending.size > 0) {
      const addresses = [...announcer.pending].sort()
      announcer.pending.clear()
      try {
        await announce(root, addresses)
      } catch (err) {
        try { announcer.onError(err, addresses.length) } catch {}
      }
    }
  }).finally(() => {
    announcer.running = undefined
    // A feed added after the loop's last look (between its end and this) is announced too.
    if (announcer.pending.size > 0) schedule(root, announcer)
  })
}

/**
 * Tells every instance's listeners that these feeds grew, once what `db` wrote has committed
 * (at once if `db` is the database, else when its transaction commits; never if it rolls back).
 */
export function announceGrowth (db: Db, addresses: Iterable<string>): void {
  const grown = [...addresses]
  if (grown.length === 0) return
  afterCommit(db, (root) => {
    const announcer = announcerOf(root)
    for (const address of grown) announcer.pending.add(address)
    schedule(root, announcer)
  })
}

/**
 * Waits (SETTLE_MS at most) for the announcements still to be made on `root`: shutdown, before
 * the database closes, so the last writes wake other instances' waiters at once.
 */
export async function settleAnnouncements (root: Db): Promise<void> {
  const deadline = performance.now() + SETTLE_MS
  for (let running = announcers.get(root)?.running; running !== undefined; running = announcers.get(root)?.running) {
    const left = deadline - performance.now()
    if (left <= 0) return
    let timer: NodeJS.Timeout | undefined
    await Promise.race([running, new Promise((resolve) => { timer = setTimeout(resolve, left) })])
    clearTimeout(timer)
  }
}

/** Whom to tell when an announcement on `root` fails (the event bus logs it). */
export function onAnnounceError (root: Db, report: (err: unknown, addresses: number) => void): void {
  announcerOf(root).onError = report
}
