import { createHash } from 'node:crypto'
import { sql, type SQL } from 'drizzle-orm'
import { queryPrepared } from '../../db/rows.js'
import type { Db } from '../../db/client.js'
import { AppError, Forbidden, NotFound, ValidationFailed } from '../../errors.js'
import { isAddress, isGroupId, newId } from '../../ids.js'
import type { UploadedFile } from '../../plugins/uploads.js'
import { notifyCalls } from '../events/events.repository.js'
import { createGroupsRepository } from '../groups/groups.repository.js'
import { memberGroup } from '../groups/groups.service.js'
import type { Principal } from '../keys/authenticator.js'
import { createQuotaRepository, nextUtcMidnight, utcDay, type QuotaState } from '../quota/quota.repository.js'
import { createUsersRepository } from '../users/users.repository.js'
import { createMessagesRepository } from './messages.repository.js'
import type { Message } from './messages.schemas.js'

/** How long an Idempotency-Key answers for its send. */
export const IDEMPOTENCY_WINDOW_MS = 24 * 60 * 60 * 1000

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
  const address = recipient.toLowerCase()
  if (!isAddress(address)) {
    throw new ValidationFailed('recipient: must be a user address (a-z 0-9 . @ + -) or a group id (grp_…)')
  }
  return address
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
  const exists = toUser ? sql`EXISTS (SELECT 1 FROM users WHERE address = ${target.recipient} AND deactivated_at IS NULL)` : sql`TRUE`
  const deactivated = toUser ? sql`EXISTS (SELECT 1 FROM users WHERE address = ${target.recipient} AND deactivated_at IS NOT NULL)` : sql`FALSE`
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
  // The message's time is the database's, and its events' the very same: now() (the
  // transaction's start) cut to the millisecond the wire form carries (drivers round
  // microseconds their own way), written as JavaScript's toISOString() does.
  parts.push(sql`clock AS (
      SELECT at, to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"') AS iso
      FROM (SELECT date_trunc('milliseconds', now()) AS at) AS t)`)
  parts.push(sql`written AS (
      INSERT INTO messages (id, sender, recipient, body, created_at)
      SELECT ${message.id}, ${message.sender}, ${target.recipient}, ${message.body}, clock.at FROM clock
      WHERE ${counted}${toUser ? sql` AND EXISTS (SELECT 1 FROM feed)` : sql``}
      RETURNING id)`)
  if (files.length > 0) {
    const rows = sql.join(files.map((f, i) => sql`(${i + 1}::int, ${f.filename}::text, ${f.contentType}::text, ${f.size}::int, ${f.sha256}::text, ${f.uploadId}::text)`), sql`, `)
    parts.push(sql`files AS (
      INSERT INTO attachments (message_id, n, filename, content_type, size, sha256, upload_id)
      SELECT written.id, f.n, f.filename, f.content_type, f.size, f.sha256, f.upload_id
      FROM written, (VALUES ${rows}) AS f(n, filename, content_type, size, sha256, upload_id))`)
    // A small file came whole with the request: its one chunk is written here (an empty file has none).
    const inline = files.filter((f) => f.bytes !== undefined && f.bytes.length > 0)
    if (inline.length > 0) {
      const chunks = sql.join(inline.map((f) => sql`(${f.uploadId}::text, ${f.bytes}::bytea)`), sql`, `)
      parts.push(sql`inline_chunks AS (
        INSERT INTO attachment_chunks (upload_id, seq, message_id, data)
        SELECT c.upload_id, 0, written.id, c.data FROM written, (VALUES ${chunks}) AS c(upload_id, data))`)
    }
    // A larger file's bytes are already staged, chunk by chunk; the message takes them over
    // here, in the same statement, so a refused send claims nothing and they are deleted after.
    const staged = files.filter((f) => f.staged)
    if (staged.length > 0) {
      parts.push(sql`claimed AS (
        UPDATE attachment_chunks SET message_id = written.id FROM written
        WHERE attachment_chunks.upload_id = ANY(${sql.param(staged.map((f) => f.uploadId))}::text[]) AND attachment_chunks.message_id IS NULL)`)
    }
  }
  parts.push(sql`delivered AS (INSERT INTO deliveries (message_id, recipient) SELECT written.id, feed.address FROM written, feed)`)
  parts.push(sql`appended AS (
      INSERT INTO events (address, seq, type, data, message_id, created_at)
      SELECT feed.address, feed.event_seq, 'message.received', jsonb_set(${JSON.stringify({ message })}::jsonb, '{message,createdAt}', to_jsonb(clock.iso)), written.id, clock.at
      FROM feed, written, clock)`)
  const notified = notifyCalls(target.addresses).map((call) => sql`CASE WHEN EXISTS (SELECT 1 FROM written) THEN ${call} END`)
  const [row] = await queryPrepared<{ found: boolean, deactivated: boolean, used: number | null, created_at: string }>(db, sql`
    WITH ${sql.join(parts, sql`, `)}
    SELECT ${exists} AS found, ${deactivated} AS deactivated, ${d.quota === undefined ? sql`NULL::int` : sql`(SELECT count FROM counted)`} AS used,
      (SELECT iso FROM clock) AS created_at${sql.join(notified.map((n) => sql`, ${n}`))}`)
  if (row?.deactivated === true) throw new RecipientDeactivated(target.recipient)
  if (row?.found !== true) throw new NotFound('user', target.recipient)
  return { message: { ...message, createdAt: row.created_at }, used: d.quota === undefined ? 0 : row.used }
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
    recipient: input.recipient.toLowerCase(),
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

/** The quota headers' state for a key at a moment, given its count. */
export function quotaStateOf (principal: Principal, now: Date): (used: number) => QuotaState {
  return (used) => ({ limit: principal.dailyQuota, used, resetAt: nextUtcMidnight(now) })
}

/**
 * The answer to a retry with an Idempotency-Key whose send made `messageId`: that message, and
 * the key's count, sending nothing and counting nothing.
 */
export async function replay (db: Db, principal: Principal, now: Date, messageId: string): Promise<SendResult> {
  const messages = createMessagesRepository(db)
  const row = await messages.find(messageId)
  // Its sender deleted it: the body is erased, so there is nothing to answer with, and a
  // new send would break the promise that a retry sends nothing new.
  if (row === undefined) throw new IdempotentMessageDeleted(messageId)
  const used = await createQuotaRepository(db).used(principal.keyId, utcDay(now))
  return { message: await messages.view(row), quota: quotaStateOf(principal, now)(used), replayed: true }
}
