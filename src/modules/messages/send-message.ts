import { createHash } from 'node:crypto'
import { and, eq, gt, lte, sql, type SQL } from 'drizzle-orm'
import { queryPrepared } from '../../db/rows.js'
import type { Db } from '../../db/client.js'
import { AppError, NotFound, ValidationFailed } from '../../errors.js'
import { isAddress, isGroupId, newId } from '../../ids.js'
import type { UploadedFile } from '../../plugins/uploads.js'
import { notifyCalls } from '../events/events.repository.js'
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
 * Writes a message with everything that belongs to it, in one statement: atomic on its own or
 * inside the caller's transaction (a group send needs one, for the group's shared lock taken
 * by resolveRecipients). Each write feeds the next, which also orders them: the quota count
 * (for a user, only if the user exists), the recipients' feed ids (only if counted; several
 * rows locked in address order), the message (only if counted, and for a user only if its
 * feed was found), then its files, a delivery row and a message.received event per recipient,
 * and the NOTIFY. So a refused send writes nothing, and the answer says which refusal it was.
 * The quota upsert's row lock serialises a key's concurrent sends on every instance and its
 * WHERE refuses the one past the limit: N racing sends against R remaining give min(N, R).
 * Locks are taken in one order everywhere: the key's quota row, then user rows in address
 * order, so sends never deadlock one another. Answers the message and the key's new count,
 * null when the quota was already used up.
 */
export async function deliverMessage (db: Db, d: Delivery): Promise<{ message: Message, used: number | null }> {
  const target = await resolveRecipients(db, d.sender, d.recipient, true)
  const toUser = !isGroupId(target.recipient)
  const { message, files } = newMessage(d, target.recipient)
  const exists = toUser ? sql`EXISTS (SELECT 1 FROM users WHERE address = ${target.recipient})` : sql`TRUE`
  const parts: SQL[] = []
  let counted = sql`TRUE`
  if (d.quota !== undefined) {
    parts.push(sql`counted AS (
      INSERT INTO quota_usage (key_id, day, count) SELECT ${d.quota.keyId}, ${d.quota.day}::date, 1 WHERE ${exists} AND ${d.quota.limit}::int > 0
      ON CONFLICT (key_id, day) DO UPDATE SET count = quota_usage.count + 1 WHERE quota_usage.count < ${d.quota.limit}::int
      RETURNING count)`)
    counted = sql`EXISTS (SELECT 1 FROM counted)`
  }
  // One parameter holding the array (a bare JS array would become a list of parameters).
  const addressList = sql.param(target.addresses)
  const ordered = target.addresses.length > 1
    ? sql` AND address IN (SELECT address FROM users WHERE address = ANY(${addressList}::text[]) ORDER BY address FOR NO KEY UPDATE)`
    : sql``
  parts.push(sql`feed AS (
      UPDATE users SET event_seq = event_seq + 1 WHERE address = ANY(${addressList}::text[])${ordered} AND ${counted}
      RETURNING address, event_seq)`)
  parts.push(sql`written AS (
      INSERT INTO messages (id, sender, recipient, body, created_at)
      SELECT ${message.id}, ${message.sender}, ${target.recipient}, ${message.body}, ${message.createdAt}::timestamptz
      WHERE ${counted}${toUser ? sql` AND EXISTS (SELECT 1 FROM feed)` : sql``}
      RETURNING id)`)
  if (files.length > 0) {
    const rows = sql.join(files.map((f, i) => sql`(${i + 1}::int, ${f.filename}::text, ${f.contentType}::text, ${f.size}::int, ${f.sha256}::text, ${f.data}::bytea)`), sql`, `)
    parts.push(sql`files AS (
      INSERT INTO attachments (message_id, n, filename, content_type, size, sha256, data)
      SELECT written.id, f.n, f.filename, f.content_type, f.size, f.sha256, f.data
      FROM written, (VALUES ${rows}) AS f(n, filename, content_type, size, sha256, data))`)
  }
  parts.push(sql`delivered AS (INSERT INTO deliveries (message_id, recipient) SELECT written.id, feed.address FROM written, feed)`)
  parts.push(sql`appended AS (
      INSERT INTO events (address, seq, type, data, message_id)
      SELECT feed.address, feed.event_seq, 'message.received', ${JSON.stringify({ message })}::jsonb, written.id FROM feed, written)`)
  const notified = notifyCalls(target.addresses).map((call) => sql`CASE WHEN EXISTS (SELECT 1 FROM written) THEN ${call} END`)
  const [row] = await queryPrepared<{ found: boolean, used: number | null }>(db, sql`
    WITH ${sql.join(parts, sql`, `)}
    SELECT ${exists} AS found, ${d.quota === undefined ? sql`NULL::int` : sql`(SELECT count FROM counted)`} AS used${sql.join(notified.map((n) => sql`, ${n}`))}`)
  if (row?.found !== true) throw new NotFound('user', target.recipient)
  return { message, used: d.quota === undefined ? 0 : row.used }
}

/** A new message's wire form (id and time given here), and its files. */
function newMessage (d: Delivery, recipient: string): { message: Message, files: UploadedFile[] } {
  const message: Message = {
    id: newId('msg'),
    sender: d.sender,
    recipient,
    body: d.body,
    attachments: d.files.map((f, i) => ({ index: i + 1, filename: f.filename, contentType: f.contentType, size: f.size })),
    createdAt: new Date().toISOString()
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

  const quota = { keyId: principal.keyId, day, limit: principal.dailyQuota }
  const delivery: Delivery = { sender: principal.address, recipient: input.recipient, body: input.body, files: input.files, quota }
  // Without an Idempotency-Key, a message to a user is one atomic statement: no transaction.
  if (input.idempotencyKey === undefined && !isGroupId(input.recipient)) {
    const { message, used } = await deliverMessage(db, delivery)
    if (used === null) throw new QuotaExceeded(quotaState(principal.dailyQuota))
    return { message, quota: quotaState(used), replayed: false }
  }
  try {
    return await db.transaction(async (tx) => {
      const { message, used } = await deliverMessage(tx, delivery)
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
