import type { Db } from '../../db/client.js'
import { Forbidden, NotFound, ValidationFailed } from '../../errors.js'
import { isAddress, isGroupId, newId, normalizeAddress } from '../../ids.js'
import { eventDataJson } from '../events/events.repository.js'
import type { UploadedFile } from './uploaded-file.js'
import type { Principal } from '../keys/authenticator.js'
import { createQuotaRepository, type QuotaState } from '../quota/quota.repository.js'
import { readableMessage } from './access.service.js'
import type { LaneStage } from './batch-lane.js'
import { createIdempotencyRepository, requestTag, sameRequest } from './idempotency.repository.js'
import { createMessagesRepository } from './messages.repository.js'
import type { Message } from './messages.schemas.js'
import { sealEarly, type BatchOutcome, type BatchSend } from './send-batch.repository.js'
import { createSendLanes } from './send-lanes.js'
import { createSendWriter } from './send-writer.js'
import {
  IdempotencyInProgress, IdempotencyMismatch, IdempotentMessageDeleted, QuotaExceeded, RecipientDeactivated
} from './send.errors.js'

/** A recipient that is not a group, as the user address it must be (lower-case), or 400. */
export function userAddress (recipient: string): string {
  const address = normalizeAddress(recipient)
  if (!isAddress(address)) {
    throw new ValidationFailed('recipient: must be a user address (a-z 0-9 . @ + -) or a group id (grp_…)')
  }
  return address
}

/** A message to write: who sends what to whom (a user address, lower-case, or a group id). */
interface Delivery {
  sender: string
  recipient: string
  body: string
  files: UploadedFile[]
  /** A message of the same conversation it answers. */
  replyTo?: string | undefined
}

/** A new message's wire form (its id given here; its time is the database's). */
export function newMessage (d: Delivery): Message {
  return {
    id: newId('msg'),
    sender: d.sender,
    recipient: d.recipient,
    body: d.body,
    attachments: d.files.map((f, i) => ({ index: i + 1, filename: f.filename, contentType: f.contentType, size: f.size })),
    // Filled in from the statement that writes it (events: in the statement itself).
    createdAt: '',
    editedAt: null,
    replyTo: d.replyTo ?? null,
    reactions: []
  }
}

/** How a message is sent: its files' bytes, and whose day it counts against. */
interface SendOf {
  /** The files newMessage described, in the same order. */
  files: UploadedFile[]
  toGroup: boolean
  /** The API key it counts against, with that key's daily quota; null counts it for no one (the test bot's replies). */
  countsAgainst: { keyId: string, dailyQuota: number } | null
  idempotencyKey?: string | undefined
  /** With an Idempotency-Key: the request's canonical text (requestText), which its record keeps tagged. */
  request?: string | undefined
}

/** What writes `message`: one send of a batch (writeBatch), for a request and for the test bot alike. */
export function batchSendOf (message: Message, how: SendOf): BatchSend {
  return {
    keyId: how.countsAgainst?.keyId ?? null,
    limit: how.countsAgainst?.dailyQuota ?? 0,
    sender: message.sender,
    recipient: message.recipient,
    toGroup: how.toGroup,
    messageId: message.id,
    body: message.body,
    replyTo: message.replyTo,
    eventData: eventDataJson('message.received', { message }),
    files: how.files,
    idempotencyKey: how.idempotencyKey,
    request: how.request === undefined ? undefined : { text: how.request, ...requestTag(how.request) }
  }
}

export interface SendInput {
  principal: Principal
  recipient: string
  body: string
  files: UploadedFile[]
  /** A message of the same conversation, which the sender may read, that this one answers. */
  replyTo?: string | undefined
  idempotencyKey?: string | undefined
}

export interface SendResult {
  message: Message
  quota: QuotaState
  /** True when this answered an earlier send with the same Idempotency-Key. */
  replayed: boolean
}

/** What makes two sends the same send, as text (files by their own hashes): its record keeps a keyed tag of it. */
function requestText (input: SendInput): string {
  return JSON.stringify({
    recipient: normalizeAddress(input.recipient),
    body: input.body,
    replyTo: input.replyTo ?? null,
    files: input.files.map((f) => [f.filename, f.contentType, f.sha256])
  })
}

/** The quota headers' state for a key, given its count, on a day ending at `resetAt` (epoch seconds, the database's clock). */
function quotaStateOf (principal: Principal, resetAt: number): (used: number) => QuotaState {
  return (used) => ({ limit: principal.dailyQuota, used, resetAt })
}

/**
 * The answer to a retry with an Idempotency-Key whose send made `messageId`: that message, and
 * the key's count, sending nothing and counting nothing.
 */
async function replay (db: Db, principal: Principal, messageId: string): Promise<SendResult> {
  const messages = createMessagesRepository(db)
  const row = await messages.find(messageId)
  // Its sender deleted it: the body is erased, so there is nothing to answer with, and a
  // new send would break the promise that a retry sends nothing new.
  if (row === undefined) throw new IdempotentMessageDeleted(messageId)
  const { used, resetAt } = await createQuotaRepository(db).today(principal.keyId)
  return { message: await messages.view(row, principal.address), quota: quotaStateOf(principal, resetAt)(used), replayed: true }
}

/**
 * A reply's `replyTo`: a message of the conversation the send goes to (the group, or the two
 * users) that the sender may read (sent it, or has it and did not hide it); anything else, a
 * message that does not exist included, is a 400 naming the field.
 */
async function checkReply (db: Db, sender: string, recipient: string, replyTo: string): Promise<void> {
  const row = await readableMessage(createMessagesRepository(db), replyTo, sender).then(({ row }) => row, (err: unknown) => {
    if (err instanceof NotFound || err instanceof Forbidden) throw new ValidationFailed(`replyTo: no message ${replyTo} that the sender may read`)
    throw err
  })
  const sameConversation = isGroupId(recipient)
    ? row.recipient === recipient
    : (row.sender === sender && row.recipient === recipient) || (row.sender === recipient && row.recipient === sender)
  if (!sameConversation) throw new ValidationFailed(`replyTo: message ${replyTo} is not in the conversation with ${recipient}`)
}

/** A send waiting for its batch, and its request's answer. */
interface Pending {
  input: SendInput
  send: BatchSend
  message: Message
  resolve: (result: SendResult) => void
  reject: (err: unknown) => void
}

interface SendServiceOptions {
  /** Batches in flight at once per lane, each on its own connection (PGlite has one: 1). */
  concurrency: number
  /** Called with the size of every batch written (metrics). */
  onBatch?: (size: number) => void
  /** Called with each send's wait for its batch and each batch's statement time (metrics). */
  onStage?: (stage: LaneStage, seconds: number) => void
}

/**
 * POST /message's send, coalesced with the others in flight (send-lanes.ts): sends queued
 * together are written by one statement (writeBatch), one commit and one WAL flush for them
 * all, each request still answered only after that commit, each with its own outcome.
 *
 * A batch with sends to groups (or with Idempotency-Keys) is a transaction: the groups are held
 * shared (and the keys' locks taken) by a statement before the write, so the write's snapshot
 * sees the membership and the records as they stand under those locks. An Idempotency-Key's
 * lock (per API key and Idempotency-Key, on every instance) is only tried: a duplicate that
 * finds it taken never waits on the holder's locks nor writes a copy; it reads the key's record
 * after its batch (see unheld): a finished send's retry is answered as by the holder, and only
 * a duplicate of a send still in flight gets 409. The holder finds a live record and answers
 * the original message (replay), or 422 when the fields differ, or 404 when its sender deleted
 * that message; with no record it sends and records the key in the same statement. A batch
 * whose statement fails (a sender deleted meanwhile, a serialization error) is written again
 * one send at a time, so one send's failure fails no other (send-writer.ts).
 */
export function createSendService (db: Db, options: SendServiceOptions) {
  const writer = createSendWriter<Pending>(db, finish)
  const lanes = createSendLanes<Pending>(db, {
    concurrency: options.concurrency,
    observe: options.onStage,
    write (batch, written) {
      options.onBatch?.(batch.length)
      return writer.write(batch, written)
    }
  })

  /** A committed batch's outcomes, each answered; sends refused only for being counted together go again alone. */
  async function finish (batch: Pending[], outcomes: BatchOutcome[]): Promise<void> {
    const alone: Pending[] = []
    batch.forEach((p, i) => {
      const outcome = outcomes[i]!
      if (p.send.toGroup && outcome.written) lanes.remember(p.send.recipient, outcome.fanOut)
      // Counted together with other sends of its key, the lot did not fit: each asks alone.
      if (outcome.used === null && outcome.keySends > 1) alone.push(p)
      else settle(p, outcome)
    })
    for (const p of alone) await writer.write([p])
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
    if (!sameRequest(record, send.request!.text)) throw new IdempotencyMismatch(key)
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
      if (!sameRequest({ requestHash: o.earlierHash!, sealedBy: o.earlierSealedBy }, send.request!.text)) return p.reject(new IdempotencyMismatch(send.idempotencyKey!))
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
    async send (input: SendInput): Promise<SendResult> {
      if (input.body === '' && input.files.length === 0) throw new ValidationFailed('body: must not be empty unless the message has an attachment')
      const toGroup = isGroupId(input.recipient)
      const recipient = toGroup ? input.recipient : userAddress(input.recipient)
      const { principal, files, idempotencyKey } = input
      // A retry of a send already made is answered with that message (the batch replays it),
      // even if the message it replied to has gone since.
      const retried = idempotencyKey !== undefined && input.replyTo !== undefined &&
        await createIdempotencyRepository(db).find({ keyId: principal.keyId, idempotencyKey }) !== undefined
      if (input.replyTo !== undefined && !retried) await checkReply(db, principal.address, recipient, input.replyTo)
      const message = newMessage({ sender: principal.address, recipient, body: input.body, files, replyTo: input.replyTo })
      const send = batchSendOf(message, {
        files,
        toGroup,
        countsAgainst: principal,
        idempotencyKey,
        request: idempotencyKey === undefined ? undefined : requestText(input)
      })
      if (writer.retrying(send)) throw new IdempotencyInProgress(idempotencyKey!)
      sealEarly(send)
      const lane = await lanes.of(send)
      return new Promise<SendResult>((resolve, reject) => {
        const pending = { input, send, message, resolve, reject }
        if (!writer.writeIfHeld(pending)) lane.add(pending)
      })
    },
    /** Recipients whose rows other work holds, sends here waiting for them (send-writer.ts). */
    heldRecipients: () => writer.heldRecipients()
  }
}
