import type { Db } from '../../db/client.js'
import { NotFound, ValidationFailed } from '../../errors.js'
import { isGroupId } from '../../ids.js'
import { QuotaExceeded, utcDay } from '../quota/quota.repository.js'
import { writeBatch, holdIdempotencyLocks, type BatchOutcome, type BatchSend } from './send-batch.repository.js'
import type { Message } from './messages.schemas.js'
import {
  IDEMPOTENCY_WINDOW_MS, IdempotencyInProgress, IdempotencyMismatch, newMessage, quotaStateOf, RecipientDeactivated, replay,
  requestHash, sendMessage, userAddress, type SendInput, type SendResult
} from './send-message.js'

/** Sends written by one statement at most; their NOTIFY payload (addresses of ≤ 64 characters) stays under 8000 bytes. */
export const MAX_BATCH = 64

/**
 * Send batches in flight at once for a pool of `poolSize` connections. Two, measured: one in
 * flight did as well on two cores (the next batch is sent while the last one's replies are
 * written), more only made batches smaller; and with two, one batch waiting on a row lock
 * (a user row held by a group change) does not hold every other key's sends behind it.
 */
export function sendBatches (poolSize: number): number {
  return Math.max(1, Math.min(2, poolSize))
}

export interface SendCoalescerOptions {
  /** Batches in flight at once, each on its own connection (PGlite has one: 1). */
  concurrency: number
  maxBatch?: number
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
 * Commit coalescing for POST /message. A 1:1 send (with or without files) waits for a free batch slot;
 * sends that arrive while `concurrency` batches are in flight queue up and are written together
 * by the next one, in one statement (writeBatch): one commit, one WAL flush and one NOTIFY for
 * them all, each request still answered only after that commit, each with its own outcome. Under
 * light load a send finds a slot free and goes at once, alone, so coalescing adds no wait.
 *
 * A send to a group takes sendMessage's own path (a transaction holding the group shared). A batch whose statement fails
 * (a sender deleted meanwhile, a serialization error) is written again one send at a time, so
 * one send's failure fails no other.
 */
export function createSendCoalescer (db: Db, options: SendCoalescerOptions) {
  const maxBatch = Math.min(options.maxBatch ?? MAX_BATCH, MAX_BATCH)
  const queue: Pending[] = []
  let running = 0

  function pump (): void {
    while (running < options.concurrency && queue.length > 0) {
      const batch = takeBatch()
      running++
      options.onBatch?.(batch.length)
      let freed = false
      // The slot is freed as soon as the batch's statement has answered, before its requests
      // are answered, so the next batch is in PostgreSQL while this one's replies are written.
      const free = (): void => {
        if (freed) return
        freed = true
        running--
        pump()
      }
      write(batch, free).finally(free)
    }
  }

  /**
   * The next batch, oldest first: up to maxBatch sends, and one send per Idempotency-Key (two
   * retries of one key in one statement would both take its lock, which is re-entrant); a second
   * waits for the next batch, which finds the first one's record.
   */
  function takeBatch (): Pending[] {
    const batch: Pending[] = []
    const keys = new Set<string>()
    for (let i = 0; i < queue.length && batch.length < maxBatch;) {
      const p = queue[i]!
      const idem = p.send.idempotencyKey === undefined ? undefined : `${p.send.keyId} ${p.send.idempotencyKey}`
      if (idem !== undefined && keys.has(idem)) {
        i++
        continue
      }
      if (idem !== undefined) keys.add(idem)
      batch.push(p)
      queue.splice(i, 1)
    }
    return batch
  }

  async function write (batch: Pending[], written: () => void = () => {}): Promise<void> {
    const now = new Date()
    const day = utcDay(now)
    const since = new Date(now.getTime() - IDEMPOTENCY_WINDOW_MS)
    const sends = batch.map((p) => p.send)
    let outcomes: BatchOutcome[]
    try {
      outcomes = sends.some((s) => s.idempotencyKey !== undefined)
        ? await db.transaction(async (tx) => {
          const held = await holdIdempotencyLocks(tx, sends)
          sends.forEach((s, i) => { s.lockHeld = held[i] })
          return writeBatch(tx, day, since, sends)
        })
        : await writeBatch(db, day, since, sends)
    } catch (err) {
      written()
      if (batch.length === 1) {
        batch[0]!.reject(err)
        return
      }
      for (const p of batch) await write([p])
      return
    }
    written()
    const alone: Pending[] = []
    batch.forEach((p, i) => {
      const outcome = outcomes[i]!
      // Counted together with other sends of its key, the lot did not fit: each asks alone.
      if (outcome.used === null && outcome.keySends > 1 && outcome.found && !outcome.deactivated) alone.push(p)
      else settle(p, outcome, now)
    })
    for (const p of alone) await write([p])
  }

  function settle (p: Pending, o: BatchOutcome, now: Date): void {
    const { input, send } = p
    const quotaState = quotaStateOf(input.principal, now)
    if (send.idempotencyKey !== undefined && send.lockHeld !== true) return p.reject(new IdempotencyInProgress(send.idempotencyKey))
    if (o.earlierMessageId !== null) {
      if (o.earlierHash !== send.requestHash) return p.reject(new IdempotencyMismatch(send.idempotencyKey!))
      replay(db, input.principal, now, o.earlierMessageId).then(p.resolve, p.reject)
      return
    }
    if (!o.found) return p.reject(new NotFound('user', send.recipient))
    if (o.deactivated) return p.reject(new RecipientDeactivated(send.recipient))
    if (o.used === null) return p.reject(new QuotaExceeded(quotaState(input.principal.dailyQuota)))
    // Counted, but its user was deleted between the look-up and the write.
    if (!o.written) return p.reject(new NotFound('user', send.recipient))
    p.resolve({ message: { ...p.message, createdAt: o.createdAt }, quota: quotaState(o.used), replayed: false })
  }

  return {
    /** POST /message's send: coalesced when it is 1:1, else sendMessage's own path. */
    async send (input: SendInput): Promise<SendResult> {
      if (isGroupId(input.recipient)) return sendMessage(db, input)
      if (input.body === '' && input.files.length === 0) throw new ValidationFailed('body: must not be empty unless the message has an attachment')
      const recipient = userAddress(input.recipient)
      const { principal } = input
      const { message } = newMessage({ sender: principal.address, recipient, body: input.body, files: input.files }, recipient)
      const send: BatchSend = {
        keyId: principal.keyId,
        limit: principal.dailyQuota,
        sender: principal.address,
        recipient,
        messageId: message.id,
        body: input.body,
        eventData: JSON.stringify({ message }),
        files: input.files,
        idempotencyKey: input.idempotencyKey,
        requestHash: input.idempotencyKey === undefined ? undefined : requestHash(input)
      }
      return new Promise<SendResult>((resolve, reject) => {
        queue.push({ input, send, message, resolve, reject })
        pump()
      })
    }
  }
}

export type SendCoalescer = ReturnType<typeof createSendCoalescer>
