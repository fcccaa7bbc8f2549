import { sql } from 'drizzle-orm'
import { POOL_APPLICATION_NAME, type Database, type Db, type OwnListening } from '../../db/client.js'
import { queryPrepared, queryRows } from '../../db/rows.js'
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
  /** The process's own listeners (a server's), whom it may tell itself while it is alone. */
  own?: Alone
}

/**
 * How long a look that found the process alone is trusted, from when it began. While
 * announcements go out, a new look starts once the last one is half this old; past it with no
 * newer finding, announcements are NOTIFYs.
 */
const ALONE_TRUSTED_MS = 1_000
/**
 * When a process starts listening (or listens again), its waiters read their feeds once more
 * after this (event-bus.ts): an instance that was alone may have told only itself of growth
 * until it heard the newcomer's empty NOTIFY or, if it did not hear it, until its last look's
 * trust ran out (ALONE_TRUSTED_MS after that look began).
 */
export const NEWCOMER_RECHECK_MS = 2 * ALONE_TRUSTED_MS

/**
 * Whether this process is alone on its database: one server, the usual deployment, whose every
 * announcement reached only its own listener. Each was a transaction and a notification read
 * back, and at 50 connections they cost a JSON send 13 % of its CPU, Node and PostgreSQL
 * together (BENCHMARKS.md, 2026-11-29). Alone, the process hands an announcement to its own
 * listeners directly.
 *
 * "Alone" is what pg_stat_activity shows: no client session on the database but pool
 * connections (named POOL_APPLICATION_NAME, which never listen) and this process's listeners
 * (named OwnListening.name). Any other session counts as one that may listen, whatever it is
 * (another instance, one of an older version, a psql), so that a doubt costs only a NOTIFY.
 * PostgreSQL hides another role's backend_type, not its application_name or its user: such a
 * session counts unless it is named as a pool is. Background workers (autovacuum) have no user,
 * and are left out by that.
 *
 * What a listener that does not say it joined (an older version, a psql) misses: what an
 * instance alone told only itself from that listener's LISTEN until the instance's last look
 * stops being trusted, a second at most; its waiters that read in that window wait for their
 * next re-read (30 s at most).
 */
interface Alone {
  listening: OwnListening
  /** Counts each announcement by how it went: 'notify' or 'own'. */
  counted: (via: 'notify' | 'own') => void
  /** The clock looks are timed by, in ms (the app's: tests hold it still). */
  now: () => number
  alone: boolean
  /** When the last look began (`now`); -Infinity before the first. */
  lookedAt: number
  looking: boolean
  /** When a listener last said it joined: a look begun before it is out of date. */
  joinedAt: number
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

function payloadsOf (addresses: string[]): string[] {
  const payloads: string[] = []
  for (let i = 0; i < addresses.length; i += ADDRESSES_PER_NOTIFY) payloads.push(addresses.slice(i, i + ADDRESSES_PER_NOTIFY).join(','))
  return payloads
}

async function announce (root: Db, addresses: string[]): Promise<void> {
  const payloads = payloadsOf(addresses)
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

/** Looks whether any session but the pool's and this process's listeners is on the database. */
async function look (root: Db, own: Alone): Promise<void> {
  if (own.looking) return
  own.looking = true
  const began = own.now()
  try {
    const [row] = await queryRows<{ alone: boolean }>(root, sql`SELECT NOT EXISTS (
      SELECT 1 FROM pg_stat_activity
      WHERE datname = current_database() AND pid <> pg_backend_pid()
        AND usesysid IS NOT NULL AND coalesce(backend_type, 'client backend') = 'client backend'
        AND application_name IS DISTINCT FROM ${POOL_APPLICATION_NAME}
        AND application_name IS DISTINCT FROM ${own.listening.name}) AS alone`)
    // A listener that said it joined while this look ran may not be in what it read.
    if (own.joinedAt < began) own.alone = row?.alone === true
  } catch {
    // Not known: NOTIFY, and look again no sooner than after a look that answered.
    own.alone = false
  } finally {
    own.lookedAt = began
    own.looking = false
  }
}

/** Whether an announcement made now may go to this process's own listeners alone. */
function aloneNow (root: Db, own: Alone): boolean {
  const age = own.now() - own.lookedAt
  // A clock set back (a test's) makes the last look as stale as one too old.
  const fresh = age >= 0 && age < ALONE_TRUSTED_MS
  if (!fresh || age > ALONE_TRUSTED_MS / 2) void look(root, own)
  return own.alone && fresh
}

/** Counts an announcement made; a counter that throws must not stop the announcements. */
function count (own: Alone, via: 'notify' | 'own'): void {
  try { own.counted(via) } catch {}
}

/** Makes announcements, one at a time, while feeds wait to be announced; then frees the way. */
function schedule (root: Db, announcer: Announcer): void {
  if (announcer.running !== undefined) return
  announcer.running = new Promise<void>((resolve) => setImmediate(resolve)).then(async () => {
    while (announcer.pending.size > 0) {
      const addresses = [...announcer.pending].sort()
      announcer.pending.clear()
      const own = announcer.own
      if (own !== undefined && aloneNow(root, own)) {
        // Each payload on its own: one that fails to be heard costs its addresses, not the rest's.
        let failed = 0
        for (const payload of payloadsOf(addresses)) {
          try {
            own.listening.deliver(EVENTS_CHANNEL, payload)
          } catch (err) {
            failed++
            try { announcer.onError(err, payload.split(',').length) } catch {}
          }
        }
        if (failed === 0) count(own, 'own')
        continue
      }
      let made = false
      try {
        await announce(root, addresses)
        made = true
      } catch (err) {
        try { announcer.onError(err, addresses.length) } catch {}
      }
      if (made && own !== undefined) count(own, 'notify')
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

/**
 * Lets the announcements of `database` go straight to its own listeners while no other
 * session could hear them (Alone); the event bus calls it once it listens. Without it, every
 * announcement is a NOTIFY (a command's process, the embedded database).
 */
export function announceToOwnListeners (database: Database, counted: Alone['counted'], now: () => number = () => performance.now()): () => void {
  const listening = database.listening
  if (listening === undefined) return () => {}
  const own: Alone = { listening, counted, now, alone: false, lookedAt: -Infinity, looking: false, joinedAt: -Infinity }
  const stopHearing = listening.onJoined(() => {
    own.alone = false
    own.joinedAt = now()
  })
  const announcer = announcerOf(database.db)
  announcer.own = own
  return () => {
    stopHearing()
    if (announcer.own === own) announcer.own = undefined
  }
}

/** Whom to tell when an announcement on `root` fails (the event bus logs it). */
export function onAnnounceError (root: Db, report: (err: unknown, addresses: number) => void): void {
  announcerOf(root).onError = report
}
