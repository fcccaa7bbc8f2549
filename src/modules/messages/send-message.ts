import { createHash } from 'node:crypto'
import { and, eq, gt, lte, sql, type SQL } from 'drizzle-orm'
import { queryPrepared } from '../../db/rows.js'
import type { Db } from '../../db/client.js'
import { AppError, NotFound, ValidationFailed } from '../../errors.js'
import { isAddress, isGroupId, newId } from '../../ids.js'
import type { UploadedFile } from '../../plugins/uploads.js'
import { createEventsRepository, EVENTS_CHANNEL } from '../events/events.repository.js'
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
 * Writes a message with everything that belongs to it: the message and its files, a delivery
 * row per recipient, a message.received event in each recipient's feed, and the quota count.
 * Answers the message and the key's new count, which is null when the quota was already used
 * up and nothing was written. Locks are taken in one order everywhere: the key's quota row,
 * then the recipients' user rows (in address order), so sends never deadlock one another.
 */
export async function deliverMessage (db: Db, d: Delivery): Promise<{ message: Message, used: number | null }> {
  return isGroupId(d.recipient) ? deliverToGroup(db, d) : deliverToUser(db, d)
}

const NOT_COUNTED = sql`NULL::int`

/**
 * A message to a user is one statement, atomic on its own or inside a transaction: one round
 * trip. Each write feeds the next, which also orders them: the quota count (only if the user
 * exists), the recipient's feed id (only if counted), the message (only if that), then its
 * files, delivery row, event and NOTIFY (only if the message was written). So a refused send
 * writes nothing, and the answer says which refusal it was.
 */
async function deliverToUser (db: Db, d: Delivery): Promise<{ message: Message, used: number | null }> {
  const { recipient } = await resolveRecipients(db, d.sender, d.recipient, true)
  const { message, files } = newMessage(d, recipient)
  const exists = sql`EXISTS (SELECT 1 FROM users WHERE address = ${recipient})`
  const parts: SQL[] = []
  if (d.quota !== undefined) {
    parts.push(sql`counted AS (
      INSERT INTO quota_usage (key_id, day, count) SELECT ${d.quota.keyId}, ${d.quota.day}::date, 1 WHERE ${exists} AND ${d.quota.limit}::int > 0
      ON CONFLICT (key_id, day) DO UPDATE SET count = quota_usage.count + 1 WHERE quota_usage.count < ${d.quota.limit}::int
      RETURNING count)`)
  }
  parts.push(sql`feed AS (
      UPDATE users SET event_seq = event_seq + 1 WHERE address = ${recipient}${d.quota === undefined ? sql`` : sql` AND EXISTS (SELECT 1 FROM counted)`}
      RETURNING event_seq)`)
  parts.push(sql`written AS (
      INSERT INTO messages (id, sender, recipient, body, created_at)
      SELECT ${message.id}, ${message.sender}, ${recipient}, ${message.body}, ${message.createdAt}::timestamptz FROM feed
      RETURNING id)`)
  if (files.length > 0) {
    const rows = sql.join(files.map((f, i) => sql`(${i + 1}::int, ${f.filename}::text, ${f.contentType}::text, ${f.size}::int, ${f.sha256}::text, ${f.data}::bytea)`), sql`, `)
    parts.push(sql`files AS (
      INSERT INTO attachments (message_id, n, filename, content_type, size, sha256, data)
      SELECT written.id, f.n, f.filename, f.content_type, f.size, f.sha256, f.data
      FROM written, (VALUES ${rows}) AS f(n, filename, content_type, size, sha256, data))`)
  }
  parts.push(sql`delivered AS (INSERT INTO deliveries (message_id, recipient) SELECT id, ${recipient} FROM written)`)
  parts.push(sql`appended AS (
      INSERT INTO events (address, seq, type, data, message_id)
      SELECT ${recipient}, feed.event_seq, 'message.received', ${JSON.stringify({ message })}::jsonb, written.id FROM feed, written)`)
  const used = d.quota === undefined ? NOT_COUNTED : sql`(SELECT count FROM counted)`
  const [row] = await queryPrepared<{ found: boolean, used: number | null }>(db, sql`
    WITH ${sql.join(parts, sql`, `)}
    SELECT ${exists} AS found, ${used} AS used,
      CASE WHEN EXISTS (SELECT 1 FROM written) THEN pg_notify(${EVENTS_CHANNEL}, ${recipient}) END AS notified`)
  if (row?.found !== true) throw new NotFound('user', recipient)
  return { message, used: d.quota === undefined ? 0 : row.used }
}

/**
 * A message to a group, inside the caller's transaction: the quota count first, then the group
 * held shared and its members read, their feed ids, and every write as one statement of CTEs.
 */
async function deliverToGroup (tx: Db, d: Delivery): Promise<{ message: Message, used: number | null }> {
  let used: number | null = 0
  if (d.quota !== undefined) {
    used = await createQuotaRepository(tx).consume(d.quota.keyId, d.quota.day, d.quota.limit) ?? null
  }
  const target = await resolveRecipients(tx, d.sender, d.recipient)
  const { message, files } = newMessage(d, target.recipient)
  if (used === null) return { message, used }
  const feeds = createEventsRepository(tx)
  const first = await feeds.reserve(new Map(target.addresses.map((a) => [a, 1])))
  const { writes } = createMessagesRepository(tx).insertWrites({ ...message, files, createdAt: new Date(message.createdAt), recipients: target.addresses })
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
  await tx.execute(sql`WITH ${sql.join(parts, sql`, `)} SELECT ${notify}`)
  return { message, used }
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
