import { setTimeout as sleep } from 'node:timers/promises'
import type { Db } from '../../db/client.js'
import { isDatabaseUnavailable, sqlState } from '../../db/errors.js'
import { Forbidden, NotFound, Unavailable, ValidationFailed } from '../../errors.js'
import { isGroupId } from '../../ids.js'
import { eventDataJson } from '../events/events.repository.js'
import { createGroupsRepository } from '../groups/groups.repository.js'
import { QuotaExceeded } from '../quota/quota.repository.js'
import { boundLockWaits, holdGroups, writeBatch, type BatchOutcome, type BatchSend } from './send-batch.repository.js'
import { createIdempotencyRepository } from './idempotency.repository.js'
import type { Message } from './messages.schemas.js'
import {
  IdempotencyInProgress, IdempotencyMismatch, newMessage, quotaStateOf, RecipientDeactivated, replay,
  requestHash, userAddress, type SendInput, type SendResult
} from './send.service.js'

/** Sends to users written by one statement at most. */
const MAX_BATCH = 64
/**
 * Sends to groups written by one statement at most: each fans out to up to MAX_GROUP_MEMBERS
 * rows, so their batches are smaller, and they have lanes of their own, so a send to one user
 * never waits behind a large group's fan-out.
 */
const MAX_GROUP_BATCH = 16

/**
 * A group send reaching this many members or more goes to the large groups' lane, with batches
 * of their own (and a second beside a stuck one, as in every lane). Without it one key sending
 * to a 1,000-member group, four at a time as admission lets it, filled both batches of the
 * group lane with 1,000-row fan-outs, and another key's send to a group of three waited behind
 * them (p99 428 ms; see test/operations/noisy-neighbour.test.ts). A group's size is counted
 * on its first send in this process and then taken from each write; a batch of either group
 * lane takes at most LARGE_BATCH_ROWS recipients (one send always goes, however large), so a
 * group that grew since it was counted still fans out a bounded batch.
 */
const LARGE_FAN_OUT = 100
const LARGE_BATCH_ROWS = 2_000
/** Group sizes remembered, the most recently sent to kept. */
const GROUP_SIZES_KEPT = 10_000

/**
 * Send batches in flight at once for a pool of `poolSize` connections, per kind (users, groups):
 * two at most, the second only while it pays (see SECOND_BATCH_QUEUE). More only made batches
 * smaller on two cores.
 */
export function sendBatches (poolSize: number): number {
  return Math.max(1, Math.min(2, poolSize))
}

/**
 * A batch goes beside one already in flight only when this many sends wait, or when the one in
 * flight has taken SECOND_BATCH_AFTER_MS (it may wait on a row lock, say a user row held by a
 * group change, and must not hold every other key's sends behind it). Measured at 10
 * connections: one batch at a time 3,115-3,182 sends/s, two 2,693-2,755 (smaller batches, more
 * commits); at 50, where the queue is long, the second batch keeps PostgreSQL busy while Node
 * answers the first.
 */
const SECOND_BATCH_QUEUE = 16
const SECOND_BATCH_AFTER_MS = 20

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
 * statements meanwhile, see db/rows.ts).
 */
const RETRYABLE = new Set(['55P03', '40001', '40P01', '26000', '42P05'])
/** A try whose Idempotency-Key another send held: tried again like a serialization failure. */
const KEY_BUSY = Object.assign(new Error('the Idempotency-Key is held by a duplicate being written'), { code: '40001' })
/** What a send to a recipient already known held starts from: as if its try had timed out. */
const ROWS_HELD = Object.assign(new Error('the recipient\'s rows are held by other work'), { code: '55P03' })

export interface SendCoalescerOptions {
  /** Batches in flight at once per kind, each on its own connection (PGlite has one: 1). */
  concurrency: number
  /** Called with the size of every batch written (metrics). */
  onBatch?: (size: number) => void
}

interface Pending {
  input: SendInput
  send: BatchSend
  message: Message
  resolve: (result: SendResult) => void
  reject: (err: unknown) => void
}

/**
 * Commit coalescing for POST /message. A send waits for a free batch slot; sends that arrive
 * while `concurrency` batches are in flight queue up and are written together by the next one,
 * in one statement (writeBatch): one commit, one WAL flush and one round of NOTIFY for them all,
 * each request still answered only after that commit, each with its own outcome. Under light
 * load a send finds a slot free and goes at once, alone, so coalescing adds no wait.
 *
 * A batch with sends to groups (or with Idempotency-Keys) is a transaction: the groups are held
 * shared (and the keys' locks taken) by a statement before the write, so the write's snapshot
 * sees the membership and the records as they stand under those locks. An Idempotency-Key's
 * lock (per API key and Idempotency-Key, on every instance) is only tried: a duplicate that
 * finds it taken never waits on the holder's locks nor writes a copy; it reads the key's record
 * after its batch (see unheld): a finished send's retry is answered as by the holder, and only
 * a duplicate of a send still in flight gets 409. The holder finds a live record and answers the original message (replay), or 422 when
 * the fields differ, or 404 when its sender deleted that message; with no record it sends and
 * records the key in the same statement. A batch whose statement
 * fails (a sender deleted meanwhile, a serialization error) is written again one send at a
 * time, so one send's failure fails no other.
 */
export function createSendCoalescer (db: Db, options: SendCoalescerOptions) {
  const toUsers = lanes(MAX_BATCH, options.concurrency)
  const toGroups = lanes(MAX_GROUP_BATCH, options.concurrency, LARGE_BATCH_ROWS)
  const toLargeGroups = lanes(MAX_GROUP_BATCH, options.concurrency, LARGE_BATCH_ROWS)
  // Recipients each group's last send reached: which lane its next send takes.
  const groupSizes = new Map<string, number>()

  /**
   * A queue and its batches in flight. With a row budget, a batch takes sends while their
   * groups' fan-outs fit (a size unknown counts as the whole budget), the first one always.
   */
  function lanes (maxBatch: number, concurrency: number, rowBudget = Infinity) {
    const queue: Pending[] = []
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
        const batch = takeBatch()
        let started = performance.now()
        while (inFlight.has(started)) started += 1e-6
        inFlight.add(started)
        options.onBatch?.(batch.length)
        // The slot is freed as soon as the batch's statement has answered, before its requests
        // are answered, so the next batch is in PostgreSQL while this one's replies are written.
        const free = (): void => {
          if (inFlight.delete(started)) pump()
        }
        write(batch, free).finally(free)
      }
    }

    /**
     * The next batch, oldest first: up to maxBatch sends. A send with an Idempotency-Key goes
     * only in a batch with no other send of its API key: its quota is then asked alone and never
     * retried in a later transaction, after its lock was let go (a retry with other fields could
     * take the key meanwhile). The others wait for the next batch.
     */
    function takeBatch (): Pending[] {
      const batch: Pending[] = []
      const apiKeys = new Set<string>()
      const keyed = new Set<string>()
      let rows = 0
      for (let i = 0; i < queue.length && batch.length < maxBatch;) {
        const p = queue[i]!
        const apiKey = p.input.principal.keyId
        const hasKey = p.send.idempotencyKey !== undefined
        const cost = rowBudget === Infinity ? 0 : groupSizes.get(p.send.recipient) ?? rowBudget
        if (keyed.has(apiKey) || (hasKey && apiKeys.has(apiKey)) || (batch.length > 0 && rows + cost > rowBudget)) {
          i++
          continue
        }
        rows += cost
        apiKeys.add(apiKey)
        if (hasKey) keyed.add(apiKey)
        batch.push(p)
        queue.splice(i, 1)
      }
      return batch
    }

    return {
      add (p: Pending): void {
        queue.push(p)
        pump()
      }
    }
  }

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
    return db.transaction(async (tx) => {
      await boundLockWaits(tx, LOCK_WAIT_MS)
      if (keyed) {
        const held = await createIdempotencyRepository(tx).tryLocks(sends.map((s) => s.idempotencyKey === undefined || s.keyId === null ? undefined : { keyId: s.keyId, idempotencyKey: s.idempotencyKey }))
        sends.forEach((s, i) => { s.lockHeld = held[i] === true })
      }
      if (groups.length > 0) await holdGroups(tx, groups)
      return writeBatch(tx, sends, bounded)
    })
  }

  async function write (queued: Pending[], written: () => void = () => {}): Promise<void> {
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
    await finish(batch, outcomes)
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
  async function writeAlone (p: Pending, failed: unknown, tried: () => void, first: 0 | 1): Promise<void> {
    const deadline = performance.now() + ALONE_DEADLINE_MS
    const { recipient } = p.send
    let err = failed
    let lead: (() => void) | undefined
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
        await finish([p], outcomes)
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

  /** A committed batch's outcomes, each answered; sends refused only for being counted together go again alone. */
  async function finish (batch: Pending[], outcomes: BatchOutcome[]): Promise<void> {
    const alone: Pending[] = []
    batch.forEach((p, i) => {
      const outcome = outcomes[i]!
      if (p.send.toGroup && outcome.written) remember(p.send.recipient, outcome.fanOut)
      // Counted together with other sends of its key, the lot did not fit: each asks alone.
      if (outcome.used === null && outcome.keySends > 1) alone.push(p)
      else settle(p, outcome)
    })
    for (const p of alone) await write([p])
  }

  function remember (group: string, size: number): void {
    groupSizes.delete(group)
    groupSizes.set(group, size)
    if (groupSizes.size > GROUP_SIZES_KEPT) groupSizes.delete(groupSizes.keys().next().value!)
  }

  /** A send's lane: to a user, to a small group, or to a large one (counted on first sight). */
  async function laneOf (send: BatchSend) {
    if (!send.toGroup) return toUsers
    const size = groupSizes.get(send.recipient) ?? await countOnce(send.recipient)
    return size < LARGE_FAN_OUT ? toGroups : toLargeGroups
  }

  // Counts in flight: sends to a group not yet counted all wait on the one count, and so join
  // their lane in the order they were made.
  const counting = new Map<string, Promise<number>>()
  function countOnce (group: string): Promise<number> {
    let count = counting.get(group)
    if (count === undefined) {
      count = createGroupsRepository(db).activeMemberCount(group)
        .then((size) => { remember(group, size); return size })
        .finally(() => counting.delete(group))
      counting.set(group, count)
    }
    return count
  }

  /**
   * A send whose Idempotency-Key's lock was taken: by the send it repeats, still in flight (409),
   * or by another retry of a send that has finished, whose record is committed (looked up
   * after this batch's transaction ended, so a holder that committed meanwhile counts): the
   * original message, or 422 when the fields differ. Before, every such retry was 409, though
   * nothing was in flight.
   */
  async function unheld (input: SendInput, send: BatchSend): Promise<SendResult> {
    const key = send.idempotencyKey!
    const record = send.keyId === null
      ? undefined
      : await createIdempotencyRepository(db).find({ keyId: send.keyId, idempotencyKey: key })
    if (record === undefined) throw new IdempotencyInProgress(key)
    if (record.requestHash !== send.requestHash) throw new IdempotencyMismatch(key)
    return replay(db, input.principal, record.messageId)
  }

  function settle (p: Pending, o: BatchOutcome): void {
    const { input, send } = p
    // The day and its reset are the database's (the statement's clock), not this instance's.
    const quotaState = quotaStateOf(input.principal, o.resetAt)
    if (send.idempotencyKey !== undefined && send.lockHeld !== true) {
      unheld(input, send).then(p.resolve, p.reject)
      return
    }
    if (o.earlierMessageId !== null) {
      if (o.earlierHash !== send.requestHash) return p.reject(new IdempotencyMismatch(send.idempotencyKey!))
      replay(db, input.principal, o.earlierMessageId).then(p.resolve, p.reject)
      return
    }
    if (!o.found) return p.reject(new NotFound(send.toGroup ? 'group' : 'user', send.recipient))
    if (send.toGroup && !o.member) return p.reject(new Forbidden(`group ${send.recipient} is visible to its members only`))
    if (o.deactivated) return p.reject(new RecipientDeactivated(send.recipient))
    if (o.used === null) return p.reject(new QuotaExceeded(quotaState(input.principal.dailyQuota)))
    // Counted, but its user was deleted between the look-up and the write.
    if (!o.written) return p.reject(new NotFound('user', send.recipient))
    p.resolve({ message: { ...p.message, createdAt: o.createdAt }, quota: quotaState(o.used), replayed: false })
  }

  return {
    /** POST /message's send, coalesced with the others in flight. */
    async send (input: SendInput): Promise<SendResult> {
      if (input.body === '' && input.files.length === 0) throw new ValidationFailed('body: must not be empty unless the message has an attachment')
      const toGroup = isGroupId(input.recipient)
      const recipient = toGroup ? input.recipient : userAddress(input.recipient)
      const { principal } = input
      const { message } = newMessage({ sender: principal.address, recipient, body: input.body, files: input.files }, recipient)
      const send: BatchSend = {
        keyId: principal.keyId,
        limit: principal.dailyQuota,
        sender: principal.address,
        recipient,
        toGroup,
        messageId: message.id,
        body: input.body,
        eventData: eventDataJson('message.received', { message }),
        files: input.files,
        idempotencyKey: input.idempotencyKey,
        requestHash: input.idempotencyKey === undefined ? undefined : requestHash(input)
      }
      const retrying = keyOf(send)
      if (retrying !== undefined && retryingKeys.has(retrying)) throw new IdempotencyInProgress(send.idempotencyKey!)
      const lane = await laneOf(send)
      return new Promise<SendResult>((resolve, reject) => {
        const pending = { input, send, message, resolve, reject }
        // Its recipient's rows are held and a send here is already waiting for them: this one
        // waits beside it, out of the batches, which would only meet the same lock.
        if (held.has(recipient)) void writeAlone(pending, ROWS_HELD, () => {}, 1)
        else lane.add(pending)
      })
    }
  }
}
