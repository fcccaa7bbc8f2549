import { createHash } from 'node:crypto'
import { and, eq, gt, lte, sql } from 'drizzle-orm'
import { queryRows } from '../../db/rows.js'
import type { Db } from '../../db/client.js'
import { AppError, NotFound, ValidationFailed } from '../../errors.js'
import { isAddress, isGroupId, newId } from '../../ids.js'
import type { UploadedFile } from '../../plugins/uploads.js'
import { createEventsRepository } from '../events/events.repository.js'
import { createGroupsRepository } from '../groups/groups.repository.js'
import { memberGroup } from '../groups/groups.service.js'
import type { Principal } from '../keys/authenticator.js'
import { createQuotaRepository, nextUtcMidnight, QuotaExceeded, utcDay, type QuotaState } from '../quota/quota.repository.js'
import { createUsersRepository } from '../users/users.repository.js'
import { idempotencyKeys } from './idempotency.table.js'
import { createMessagesRepository } from './messages.repository.js'
import type { Message } from './messages.schemas.js'

const IDEMPOTENCY_WINDOW_MS = 24 * 60 * 60 * 1000

export class IdempotencyMismatch extends AppError {
  constructor (key: string) {
    super(422, 'IDEMPOTENCY_MISMATCH', `Idempotency-Key ${JSON.stringify(key)} was already used with different fields`)
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
    return { recipient, addresses: (await groups.members(recipient)).filter((a) => a !== sender) }
  }
  const address = recipient.toLowerCase()
  if (!isAddress(address)) {
    throw new ValidationFailed('recipient: must be a user address (a-z 0-9 . @ + -) or a group id (grp_…)')
  }
  if (!known && await createUsersRepository(db).find(address) === undefined) throw new NotFound('user', address)
  return { recipient: address, addresses: [address] }
}

export interface Delivery {
  sender: string
  recipient: string
  body: string
  files: UploadedFile[]
  /** Count the send against this key's day (a bot's reply counts for no one). */
  quota?: { keyId: string, day: string, limit: number }
}

/**
 * Writes a message with everything that belongs to it, inside the caller's transaction: the
 * message and its files, a delivery row per recipient, a message.received event in each
 * recipient's feed, and the quota count. Two statements for a message to a user (the
 * recipients' feed ids, which also proves the user exists; then every write as one statement
 * of CTEs), so a send costs four round trips with BEGIN and COMMIT. Answers the message and
 * the key's new count, which is null when the quota was already used up (the caller then
 * rolls back).
 */
export async function deliverMessage (tx: Db, d: Delivery): Promise<{ message: Message, used: number | null }> {
  const target = await resolveRecipients(tx, d.sender, d.recipient, true)
  const feeds = createEventsRepository(tx)
  const first = await feeds.reserve(new Map(target.addresses.map((a) => [a, 1])))
  if (!isGroupId(target.recipient) && !first.has(target.recipient)) throw new NotFound('user', target.recipient)
  const { message, writes } = createMessagesRepository(tx).insertWrites({
    id: newId('msg'), sender: d.sender, recipient: target.recipient, body: d.body, files: d.files, createdAt: new Date(), recipients: target.addresses
  })
  // Drizzle puts an embedded query in parentheses: exactly what a CTE needs.
  const parts = writes.map((write, i) => sql`w${sql.raw(String(i))} AS ${write}`)
  let notify = sql`NULL`
  if (target.addresses.length > 0) {
    const appended = feeds.appendWrites(target.addresses.map((address) => ({
      address, type: 'message.received', data: { message }, messageId: message.id
    })), first)
    parts.push(sql`appended AS ${appended.insert}`)
    notify = appended.notify
  }
  let used = sql`NULL::int`
  if (d.quota !== undefined) {
    if (d.quota.limit <= 0) return { message, used: null }
    parts.push(sql`counted AS ${createQuotaRepository(tx).consumeWrite(d.quota.keyId, d.quota.day, d.quota.limit)}`)
    used = sql`(SELECT count FROM counted)`
  }
  const [row] = await queryRows<{ used: number | null }>(tx, sql`WITH ${sql.join(parts, sql`, `)} SELECT ${used} AS used, ${notify}`)
  return { message, used: row?.used ?? null }
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
function requestHash (input: SendInput): string {
  return createHash('sha256').update(JSON.stringify({
    recipient: input.recipient.toLowerCase(),
    body: input.body,
    files: input.files.map((f) => [f.filename, f.contentType, f.sha256])
  })).digest('hex')
}

/** Raised inside the transaction to roll it back when a racing duplicate committed first. */
class DuplicateCommitted extends Error {}

/**
 * POST /message: one transaction holds the message, its deliveries and events, the
 * Idempotency-Key record and the day's quota count, so a send is either all there (and
 * answered 200 after commit) or not at all.
 */
export async function sendMessage (db: Db, input: SendInput): Promise<SendResult> {
  const { principal } = input
  if (input.body === '' && input.files.length === 0) {
    throw new ValidationFailed('body: must not be empty unless the message has an attachment')
  }
  const now = new Date()
  const day = utcDay(now)
  const quotaState = (used: number): QuotaState => ({ limit: principal.dailyQuota, used, resetAt: nextUtcMidnight(now) })
  const hash = input.idempotencyKey === undefined ? undefined : requestHash(input)

  const replay = async (): Promise<SendResult | undefined> => {
    if (input.idempotencyKey === undefined) return undefined
    const [earlier] = await db.select().from(idempotencyKeys).where(and(
      eq(idempotencyKeys.keyId, principal.keyId),
      eq(idempotencyKeys.idempotencyKey, input.idempotencyKey),
      gt(idempotencyKeys.createdAt, new Date(now.getTime() - IDEMPOTENCY_WINDOW_MS))
    ))
    if (earlier === undefined) return undefined
    if (earlier.requestHash !== hash) throw new IdempotencyMismatch(input.idempotencyKey)
    const messages = createMessagesRepository(db)
    const row = await messages.find(earlier.messageId)
    if (row === undefined) return undefined
    const used = await createQuotaRepository(db).used(principal.keyId, day)
    return { message: await messages.view(row), quota: quotaState(used), replayed: true }
  }

  const earlier = await replay()
  if (earlier !== undefined) return earlier

  try {
    return await db.transaction(async (tx) => {
      const quota = { keyId: principal.keyId, day, limit: principal.dailyQuota }
      const { message, used } = await deliverMessage(tx, { sender: principal.address, recipient: input.recipient, body: input.body, files: input.files, quota })
      if (used === null) throw new QuotaExceeded(quotaState(principal.dailyQuota))
      if (input.idempotencyKey !== undefined) {
        // An expired record may be replaced; a live one makes this send a duplicate. A racing
        // duplicate waits on the insert below until the first commits, then finds the key taken.
        await tx.delete(idempotencyKeys).where(and(
          eq(idempotencyKeys.keyId, principal.keyId),
          eq(idempotencyKeys.idempotencyKey, input.idempotencyKey),
          lte(idempotencyKeys.createdAt, new Date(now.getTime() - IDEMPOTENCY_WINDOW_MS))
        ))
        const claimed = await tx.insert(idempotencyKeys)
          .values({ keyId: principal.keyId, idempotencyKey: input.idempotencyKey, requestHash: hash!, messageId: message.id })
          .onConflictDoNothing()
          .returning({ key: idempotencyKeys.idempotencyKey })
        if (claimed.length === 0) throw new DuplicateCommitted()
      }
      return { message, quota: quotaState(used), replayed: false }
    })
  } catch (err) {
    if (err instanceof DuplicateCommitted) {
      const original = await replay()
      if (original !== undefined) return original
      // The racing send's message is already gone again: nothing to answer with.
      throw new AppError(409, 'IDEMPOTENCY_IN_PROGRESS', `Idempotency-Key ${JSON.stringify(input.idempotencyKey)} is in use by another request; retry`)
    }
    throw err
  }
}
