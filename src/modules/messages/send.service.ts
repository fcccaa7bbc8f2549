import { createHash } from 'node:crypto'
import type { Db } from '../../db/client.js'
import { AppError, Forbidden, NotFound, ValidationFailed } from '../../errors.js'
import { isAddress, isGroupId, newId, normalizeAddress } from '../../ids.js'
import type { UploadedFile } from './uploaded-file.js'
import { createGroupsRepository } from '../groups/groups.repository.js'
import { memberGroup } from '../groups/groups.service.js'
import type { Principal } from '../keys/authenticator.js'
import { createQuotaRepository, type QuotaState } from '../quota/quota.repository.js'
import { createUsersRepository } from '../users/users.repository.js'
import { createMessagesRepository } from './messages.repository.js'
import type { Message } from './messages.schemas.js'

export class IdempotencyMismatch extends AppError {
  constructor (key: string) {
    super(422, 'IDEMPOTENCY_MISMATCH', `Idempotency-Key ${JSON.stringify(key)} was already used with different fields`)
  }
}

/** A message or typing to a user an operator deactivated: refused, naming why (API.md §9). */
export class RecipientDeactivated extends Forbidden {
  constructor (address: string) {
    super(`user ${address} is deactivated and receives nothing`)
  }
}

/**
 * Who a message (or a typing indicator) goes to: a user itself, or every member of a group but
 * the sender, who must be a member. Inside a transaction the group is held shared, so a
 * membership change cannot interleave and a message never reaches a non-member. With `known`,
 * a user recipient is not looked up: the caller learns whether it exists another way.
 */
export async function resolveRecipients (db: Db, sender: string, recipient: string, known = false): Promise<{ recipient: string, addresses: string[] }> {
  if (isGroupId(recipient)) {
    const groups = createGroupsRepository(db)
    await memberGroup(groups, recipient, sender, 'share')
    return { recipient, addresses: (await groups.activeMembers(recipient)).filter((a) => a !== sender) }
  }
  const address = userAddress(recipient)
  if (!known) {
    const user = await createUsersRepository(db).find(address)
    if (user === undefined) throw new NotFound('user', address)
    if (user.deactivatedAt !== null) throw new RecipientDeactivated(address)
  }
  return { recipient: address, addresses: [address] }
}

/** A recipient that is not a group, as the user address it must be (lower-case), or 400. */
export function userAddress (recipient: string): string {
  const address = normalizeAddress(recipient)
  if (!isAddress(address)) {
    throw new ValidationFailed('recipient: must be a user address (a-z 0-9 . @ + -) or a group id (grp_…)')
  }
  return address
}

/** A message to write: who sends what to whom. */
export interface Delivery {
  sender: string
  recipient: string
  body: string
  files: UploadedFile[]
}

/** A new message's wire form (its id given here; its time is the database's), and its files. */
export function newMessage (d: Delivery, recipient: string): { message: Message, files: UploadedFile[] } {
  const message: Message = {
    id: newId('msg'),
    sender: d.sender,
    recipient,
    body: d.body,
    attachments: d.files.map((f, i) => ({ index: i + 1, filename: f.filename, contentType: f.contentType, size: f.size })),
    // Filled in from the statement that writes it (events: in the statement itself).
    createdAt: ''
  }
  return { message, files: d.files }
}

export interface SendInput {
  principal: Principal
  recipient: string
  body: string
  files: UploadedFile[]
  idempotencyKey?: string | undefined
}

export interface SendResult {
  message: Message
  quota: QuotaState
  /** True when this answered an earlier send with the same Idempotency-Key. */
  replayed: boolean
}

/** SHA-256 over what makes two sends the same send; files by their own hashes. */
export function requestHash (input: SendInput): string {
  return createHash('sha256').update(JSON.stringify({
    recipient: normalizeAddress(input.recipient),
    body: input.body,
    files: input.files.map((f) => [f.filename, f.contentType, f.sha256])
  })).digest('hex')
}

export class IdempotencyInProgress extends AppError {
  constructor (key: string) {
    super(409, 'IDEMPOTENCY_IN_PROGRESS', `Idempotency-Key ${JSON.stringify(key)} is in use by a send still in flight; retry once it has finished`)
  }
}

class IdempotentMessageDeleted extends AppError {
  constructor (messageId: string) {
    super(404, 'NOT_FOUND', `message ${messageId} sent with this Idempotency-Key was deleted`)
  }
}

/** The quota headers' state for a key, given its count, on a day ending at `resetAt` (epoch seconds, the database's clock). */
export function quotaStateOf (principal: Principal, resetAt: number): (used: number) => QuotaState {
  return (used) => ({ limit: principal.dailyQuota, used, resetAt })
}

/**
 * The answer to a retry with an Idempotency-Key whose send made `messageId`: that message, and
 * the key's count, sending nothing and counting nothing.
 */
export async function replay (db: Db, principal: Principal, messageId: string): Promise<SendResult> {
  const messages = createMessagesRepository(db)
  const row = await messages.find(messageId)
  // Its sender deleted it: the body is erased, so there is nothing to answer with, and a
  // new send would break the promise that a retry sends nothing new.
  if (row === undefined) throw new IdempotentMessageDeleted(messageId)
  const { used, resetAt } = await createQuotaRepository(db).today(principal.keyId)
  return { message: await messages.view(row), quota: quotaStateOf(principal, resetAt)(used), replayed: true }
}
