import { setTimeout as sleep } from 'node:timers/promises'
import type { Db } from '../../db/client.js'
import { isDatabaseUnavailable, sqlState } from '../../db/errors.js'
import { transactionOnce } from '../../db/transaction.js'
import { Unavailable } from '../../errors.js'
import { createIdempotencyRepository } from './idempotency.repository.js'
import { boundLockWaits, holdGroups, writeBatch, type BatchOutcome, type BatchSend } from './send-batch.repository.js'
import { IdempotencyInProgress } from './send.errors.js'

/**
 * How long a send's transaction waits for any one lock (a recipient's feed row, a quota row, a
 * group) before it gives up (SET LOCAL lock_timeout). A batch waiting on one recipient's row
 * held by someone else's work (a long group change, an operator's transaction) held every quota
 * and feed row it had already taken, and every send beside it, on any instance, queued behind
 * those (an unrelated send took 3,210 ms instead of 81). Now the batch gives up after this, and
 * its sends are written one at a time (writeAlone): those whose rows are free at once, the held
 * one alone, again and again, holding nothing between tries, until its row is free.
 */
const LOCK_WAIT_MS = 50
/** How long a send alone keeps trying for a held row before it answers 503. */
const ALONE_DEADLINE_MS = 20_000
/** Waits between a send's tries alone: doubling from the first, capped, jittered. */
const RETRY_FIRST_MS = 20
const RETRY_MAX_MS = 400
/**
 * SQLSTATEs after which a send alone is tried again, nothing of it having committed: a lock
 * not had within LOCK_WAIT_MS, a serialization failure, a deadlock, and a named statement
 * lost through a pooler nobody declared (26000, 42P05: the database has turned to unnamed
 * statements meanwhile, see db/rows.ts). And 57014, "canceling statement due to user request":
 * nothing in this service cancels a send, but a lock_timeout that fires as its lock is granted
 * is reported so when the statement then waits on another lock (PostgreSQL clears the timeout's
 * mark as it arms it again, and the cancel already sent finds none): seen once in 3,000 sends
 * through PgBouncer, waiting on a quota row's insert.
 */
const RETRYABLE = new Set(['55P03', '57014', '40001', '40P01', '26000', '42P05'])
/**
 * A send alone cancelled (57014) more often than this is answered with the error: a
 * statement_timeout an operator set, or cancels meant to shed load, are not tried again for
 * ALONE_DEADLINE_MS; a statement timeout is never tried again.
 */
const CANCEL_RETRIES = 2
function cancelledOnPurpose (err: unknown, cancels: number): boolean {
  if (cancels > CANCEL_RETRIES) return true
  for (let e: unknown = err; e instanceof Error; e = e.cause) if (e.message.includes('statement timeout')) return true
  return false
}
/** A try whose Idempotency-Key another send held: tried again like a serialization failure. */
const KEY_BUSY = Object.assign(new Error('the Idempotency-Key is held by a duplicate being written'), { code: '40001' })
/** What a send to a recipient already known held starts from: as if its try had timed out. */
const ROWS_HELD = Object.assign(new Error('the recipient\'s rows are held by other work'), { code: '55P03' })

/** A send waiting to be written, and how it is refused when it cannot be. */
interface QueuedSend {
  send: BatchSend
  reject: (err: unknown) => void
}

/**
 * Writes batches of sends, each try bounded by LOCK_WAIT_MS per lock. A batch whose statement
 * fails (a sender deleted meanwhile, a serialization error, a held row) is written again one
 * send at a time, so one send's failure fails no other; a send whose rows are held keeps trying
 * alone, holding nothing between tries, until ALONE_DEADLINE_MS. `committed` answers the sends
 * of a try that committed, with their outcomes in the same order.
 */
export function createSendWriter<P extends QueuedSend> (db: Db, committed: (batch: P[], outcomes: BatchOutcome[]) => Promise<void>) {
  /**
   * One try at a batch, bounded by LOCK_WAIT_MS per lock. To users with no Idempotency-Key it
   * is one statement, which sets its own lock_timeout; else one transaction that sets it first
   * (SET LOCAL), then tries the Idempotency-Keys' locks and holds the groups before the
   * statement. Its outcomes only once it has committed; an error rolls all of it back.
   */
  async function attempt (sends: BatchSend[]): Promise<BatchOutcome[]> {
    const groups = sends.filter((s) => s.toGroup).map((s) => s.recipient)
    const keyed = sends.some((s) => s.idempotencyKey !== undefined)
    const bounded = { lockWaitMs: LOCK_WAIT_MS }
    if (!keyed && groups.length === 0) return writeBatch(db, sends, bounded)
    // One try by design: a failed batch is split and each send tried again alone (writeAlone),
    // so a retry of the whole batch would hold every send in it behind one held row.
    return transactionOnce(db, async (tx) => {
      await boundLockWaits(tx, LOCK_WAIT_MS)
      if (keyed) {
        const held = await createIdempotencyRepository(tx).tryLocks(sends.map((s) => s.idempotencyKey === undefined || s.keyId === null ? undefined : { keyId: s.keyId, idempotencyKey: s.idempotencyKey }))
        sends.forEach((s, i) => { s.lockHeld = held[i] === true })
      }
      if (groups.length > 0) await holdGroups(tx, groups)
      return writeBatch(tx, sends, bounded)
    })
  }

  async function write (queued: P[], written: () => void = () => {}): Promise<void> {
    // A duplicate queued while the send it repeats retries alone (below) would find that key's
    // lock free between tries and could be written first: it is answered 409, as on arrival.
    const batch = queued.filter((p) => {
      const owner = retryingOwner(p.send)
      if (owner === undefined || owner === p.send) return true
      p.reject(new IdempotencyInProgress(p.send.idempotencyKey!))
      return false
    })
    if (batch.length === 0) return written()
    let outcomes: BatchOutcome[]
    try {
      outcomes = await attempt(batch.map((p) => p.send))
    } catch (err) {
      written()
      // The database away or the pool exhausted is no one send's fault: all are answered at
      // once (503), not retried one by one behind the same wait.
      if (isDatabaseUnavailable(err)) {
        for (const p of batch) p.reject(err)
        return
      }
      // One send's failure (a held row, a sender deleted meanwhile, a serialization error)
      // fails no other: each is written alone, one after another, each for one try before the
      // next starts; a send whose row is held keeps trying on its own (writeAlone).
      // Every Idempotency-Key of the batch is taken as retrying now, not as each send's turn
      // comes: a duplicate must not slip in while its original waits behind the others.
      for (const p of batch) markRetrying(p.send)
      if (batch.length === 1) {
        await writeAlone(batch[0]!, err, () => {}, 1)
        return
      }
      for (const p of batch) await new Promise<void>((resolve) => { void writeAlone(p, err, resolve, 0) })
      return
    }
    written()
    await committed(batch, outcomes)
  }

  /**
   * Recipients (a user address or a group id) whose rows a send alone found held, each with a
   * promise of the one send still trying for it here (the leader), settled when that send is
   * done. Other sends to such a recipient wait for it holding nothing, neither a connection nor
   * a lock: each try holds its key's quota row while it waits for the held one, so twenty sends
   * of one key trying at once kept that key's quota row taken, and its sends to anyone else
   * waited behind them (measured: 19 s).
   */
  const held = new Map<string, Promise<void>>()
  /**
   * Idempotency-Keys (API key and key) of sends here retrying alone. Between tries such a send
   * holds no lock, its Idempotency-Key's included, so a duplicate arriving here is answered 409
   * from this set. One arriving at another instance meanwhile may take the key between tries:
   * it then sends as the first would (its record and message in one statement under the key's
   * lock), and whichever commits second finds the record and answers the original (or 422), so
   * nothing is sent twice nor counted twice either way.
   */
  const retryingKeys = new Map<string, BatchSend>()
  const keyOf = (s: BatchSend): string | undefined => s.idempotencyKey === undefined || s.keyId === null ? undefined : `${s.keyId} ${s.idempotencyKey}`
  /** The send retrying alone under this send's Idempotency-Key, if any (it may be this one). */
  const retryingOwner = (s: BatchSend): BatchSend | undefined => {
    const key = keyOf(s)
    return key === undefined ? undefined : retryingKeys.get(key)
  }
  /** Takes the send's Idempotency-Key as retrying, unless another send here holds it: true if it is now this send's. */
  function markRetrying (s: BatchSend): boolean {
    const key = keyOf(s)
    if (key === undefined) return false
    const owner = retryingKeys.get(key)
    if (owner === undefined) retryingKeys.set(key, s)
    return (owner ?? s) === s
  }

  /**
   * A send on its own, after `failed` stopped it: tried again while the failure is one to retry
   * (RETRYABLE), until ALONE_DEADLINE_MS (then 503). Between tries it holds nothing: the
   * leader for a held recipient waits a growing while, the others wait for the leader.
   * `tried` is called after its first try here, so a batch's next send need not wait for this
   * one's row to be let go. From a batch (`first` 0) the first try is at once, whatever the
   * batch's failure was (it may have been another send's); a send that failed alone (`first` 1)
   * is tried again only for a failure to retry.
   */
  async function writeAlone (p: P, failed: unknown, tried: () => void, first: 0 | 1): Promise<void> {
    const deadline = performance.now() + ALONE_DEADLINE_MS
    const { recipient } = p.send
    let err = failed
    let lead: (() => void) | undefined
    let cancels = 0
    const idempotencyKey = keyOf(p.send)
    const marked = markRetrying(p.send)
    try {
      // Another send with its Idempotency-Key retries here already (its batch failed first, or
      // both were in flight in two batches at once): this one is the duplicate of a send in
      // flight, answered 409, never written in the other's place when the row comes free.
      if (idempotencyKey !== undefined && !marked) {
        p.reject(new IdempotencyInProgress(p.send.idempotencyKey!))
        return
      }
      for (let n = first; ; n++) {
        if (n > 0) {
          const state = sqlState(err)
          if (state === undefined || !RETRYABLE.has(state) || isDatabaseUnavailable(err)) { p.reject(err); return }
          if (state === '57014' && cancelledOnPurpose(err, ++cancels)) { p.reject(err); return }
          const left = deadline - performance.now()
          if (left <= 0) {
            p.reject(new Unavailable(`recipient ${recipient}: its rows stayed locked by other work for ${ALONE_DEADLINE_MS / 1000} s; try again shortly`))
            return
          }
          const leader = lead === undefined && state === '55P03' ? held.get(recipient) : undefined
          if (leader !== undefined) {
            // Unreferenced: a wait for the leader never holds a closing process open; cleared
            // once the leader is done, so a storm of waits keeps no timers for their 20 s.
            const timer = new AbortController()
            await Promise.race([leader, sleep(left, undefined, { ref: false, signal: timer.signal }).catch(() => {})])
            timer.abort()
          } else {
            if (lead === undefined && state === '55P03') held.set(recipient, new Promise<void>((resolve) => { lead = resolve }))
            await sleep(Math.min(left, RETRY_MAX_MS, RETRY_FIRST_MS * 2 ** (n - 1)) * (0.5 + Math.random()))
          }
        }
        let outcomes: BatchOutcome[]
        try {
          outcomes = await attempt([p.send])
        } catch (caught) {
          err = caught
          if (n === first) tried()
          continue
        }
        // Its Idempotency-Key taken meanwhile by a duplicate (on another instance) that is
        // writing now: once that commits, the next try finds its record and answers it.
        if (p.send.idempotencyKey !== undefined && p.send.lockHeld !== true) {
          err = KEY_BUSY
          if (n === first) tried()
          continue
        }
        tried()
        await committed([p], outcomes)
        return
      }
    } catch (err) {
      // Never rejects: its callers do not wait for it to end (a send answered is settled once).
      p.reject(err)
    } finally {
      tried()
      if (marked) retryingKeys.delete(idempotencyKey!)
      if (lead !== undefined) {
        held.delete(recipient)
        lead()
      }
    }
  }

  return {
    /**
     * Writes a batch and answers each of its sends (a lane's write, or a send again alone).
     * `written` is called once its first statement has answered, before the sends are.
     */
    write,
    /**
     * Whether a send with this one's Idempotency-Key retries alone here: this one, arriving now,
     * is the duplicate of a send in flight (409).
     */
    retrying (send: BatchSend): boolean {
      const key = keyOf(send)
      return key !== undefined && retryingKeys.has(key)
    },
    /**
     * Starts a send to a recipient whose rows are held and a send here is already waiting for:
     * it waits beside that one, out of the batches, which would only meet the same lock. False,
     * doing nothing, when its recipient is not known held.
     */
    writeIfHeld (p: P): boolean {
      if (!held.has(p.send.recipient)) return false
      void writeAlone(p, ROWS_HELD, () => {}, 1)
      return true
    },
    /** Recipients whose rows a send here found held, and is trying alone for (a metric). */
    heldRecipients (): number {
      return held.size
    }
  }
}
