import { sql, type SQL } from 'drizzle-orm'
import type { Db } from '../../db/client.js'
import type { UploadedFile } from './uploaded-file.js'
import { queryPrepared, queryShaped } from '../../db/rows.js'
import { takeFeedIds, type EventDataJson } from '../events/events.repository.js'
import { announceGrowth } from '../events/announcements.repository.js'
import { GROUP_LOCK_CLASS } from '../groups/groups.repository.js'
import { IDEMPOTENCY_WINDOW_MS, type RequestTag } from './idempotency.repository.js'
import { keyring } from '../../sealing/keyring.js'
import { record } from '../../sealing/records.js'
import { storedBody } from './message-body.js'

/** One send of a batch, to a user or a group, counted against its key's day. */
export interface BatchSend {
  /** The API key it counts against; null counts for no one (the test bot's replies). */
  keyId: string | null
  /** The key's daily quota. */
  limit: number
  sender: string
  /** A user address, lower-case, or a group id (with `toGroup`). */
  recipient: string
  /** To every other member of the group `recipient`, who must hold it shared (holdGroups). */
  toGroup: boolean
  messageId: string
  body: string
  /** The message of the same conversation it answers, checked before it was queued; null for none. */
  replyTo: string | null
  /** The message.received event's data, `{"message": …}` (eventDataJson), its createdAt filled in by the statement. */
  eventData: EventDataJson<'message.received'>
  /** Its attachments, numbered from 1 in this order. */
  files: UploadedFile[]
  idempotencyKey?: string | undefined
  /** With an Idempotency-Key: the request's canonical text, and its keyed tag for the record (idempotency.repository.ts requestTag). */
  request?: (RequestTag & { text: string }) | undefined
  /** Whether this send holds its Idempotency-Key's advisory lock (the idempotency repository's tryLocks). */
  lockHeld?: boolean
  /** Its parts as sealed before it queued (sealEarly). */
  sealed?: SealedSend
}

/** What the statement did with one send of the batch, in the batch's order. */
export interface BatchOutcome {
  /** The recipient is a user (with `deactivated`, one that receives nothing), or a group. */
  found: boolean
  deactivated: boolean
  /** To a group: the sender is one of its members (only members may send to it). */
  member: boolean
  /** A live record of this Idempotency-Key (held sends only): the message it made, and its request's hash. */
  earlierMessageId: string | null
  earlierHash: string | null
  /** The key that record's hash is tagged under (null: a plain SHA-256 from before sealing). */
  earlierSealedBy: string | null
  /** Sends of this key in the batch that asked for quota together (0 when this one did not ask). */
  keySends: number
  /** The key's count after this send, when it was counted; null when refused or not asked. */
  used: number | null
  /** The message, its delivery and its event are written. Counted but not written: the recipient went away meanwhile. */
  written: boolean
  /** The message's time, the database's, as toISOString() writes it. */
  createdAt: string
  /**
   * Epoch seconds of the next UTC midnight by the database's clock: when the day the quota was
   * counted against (the statement's current date, in UTC) ends. X-Quota-Reset.
   */
  resetAt: number
  /** Recipients it was written to: 1 to a user, the other active members of a group. */
  fanOut: number
}

interface OutcomeRow {
  ord: number
  found: boolean
  deactivated: boolean
  member: boolean
  earlier_id: string | null
  earlier_hash: string | null
  earlier_sealed_by: string | null
  key_sends: number | null
  used: number | null
  written: boolean
  created_at: string
  reset_at: string | number
  fan_out: number | null
  /** On the first row only: every feed the batch grew, for listeners to hear of once it commits. */
  fed: string[] | null
}

/**
 * The files' bytes, as an array of one parameter each: pg sends a Buffer parameter as it is
 * (binary), but an array of them as text, every byte twice in hex and escaped, which cost a
 * multipart send more of Node's time than parsing it did. Slots are padded to a power of two,
 * so a handful of statement shapes serve every batch; null where the bytes are staged or empty.
 */
function fileBytes (slots: number): SQL {
  const params = Array.from({ length: slots }, (_, i) => sql`${sql.placeholder(`bytes${i}`)}::bytea`)
  return sql`(ARRAY[${sql.join(params, sql`, `)}])[1:${sql.placeholder('fileCount')}::int]`
}

/**
 * A send as the statement writes it: its body sealed with its search hashes, and its event's
 * data sealed (API.md §11), under the key named `sealedBy`, which the statement records.
 */
interface SealedSend {
  sealedBy: string
  stored: { body: string, searchHashes: string }
  event: string
}

function sealed (send: BatchSend): SealedSend {
  const ring = keyring()
  return {
    sealedBy: ring.active,
    stored: storedBody(send.messageId, send.body),
    // A JSON string in the jsonb column; the reader fills in message.createdAt from the event's created_at.
    // Base64 holds nothing JSON escapes, so quotes make it one (JSON.stringify scanned it: 0.6 µs a send).
    event: `"${ring.sealText(send.eventData, record.eventData('message.received', send.messageId))}"`
  }
}

/**
 * Seals a send's body, search hashes and event data now, for its batch's statement to take: a
 * request's send seals itself before it queues, while the batch ahead of it is in PostgreSQL,
 * rather than every send of a batch in turn between that batch's statement and the one before
 * (0.4 ms a batch of nine at 10 connections, 2026-11-28). A send not sealed so (the test bot's),
 * or sealed under a key no longer active, is sealed as its batch's values are made.
 */
export function sealEarly (send: BatchSend): void {
  // A property rather than a WeakMap beside it: a weak map's entries cost every young-generation
  // collection extra work, and thousands of sends are in flight at once.
  send.sealed = sealed(send)
}

/** A send of a batch with its sealed parts. */
type BatchRow = SealedSend & { send: BatchSend }

function withSealed (send: BatchSend): BatchRow {
  const early = send.sealed
  return { send, ...(early !== undefined && early.sealedBy === keyring().active ? early : sealed(send)) }
}

/** A batch's values by placeholder: one array per column, one parameter per file's bytes. */
const SEND_COLUMNS = {
  keyId: ({ send: s }: BatchRow) => s.keyId,
  lim: ({ send: s }: BatchRow) => s.limit,
  sender: ({ send: s }: BatchRow) => s.sender,
  recipient: ({ send: s }: BatchRow) => s.recipient,
  id: ({ send: s }: BatchRow) => s.messageId,
  body: ({ stored }: BatchRow) => stored.body,
  hashes: ({ stored }: BatchRow) => stored.searchHashes,
  replyTo: ({ send: s }: BatchRow) => s.replyTo,
  data: ({ event }: BatchRow) => event,
  idemKey: ({ send: s }: BatchRow) => s.idempotencyKey ?? null,
  idemHash: ({ send: s }: BatchRow) => s.request?.hash ?? null,
  idemSealedBy: ({ send: s }: BatchRow) => s.request?.sealedBy ?? null,
  held: ({ send: s }: BatchRow) => s.lockHeld === true,
  toGroup: ({ send: s }: BatchRow) => s.toGroup
}
interface BatchFile { ord: number, n: number, messageId: string, file: UploadedFile }
const sealedAs = (f: BatchFile, value: string, name: (messageId: string, n: number) => string) => keyring().sealText(value, name(f.messageId, f.n))
const FILE_COLUMNS = {
  fileOrd: (f: BatchFile) => f.ord,
  fileN: (f: BatchFile) => f.n,
  filename: (f: BatchFile) => sealedAs(f, f.file.filename, record.attachmentFilename),
  contentType: (f: BatchFile) => sealedAs(f, f.file.contentType, record.attachmentContentType),
  size: (f: BatchFile) => f.file.size,
  sha256: (f: BatchFile) => sealedAs(f, f.file.sha256, record.attachmentSha256),
  uploadId: (f: BatchFile) => f.file.uploadId,
  staged: (f: BatchFile) => f.file.staged
}

function batchValues (sends: BatchSend[], files: BatchFile[], slots: number): Record<string, unknown> {
  const ring = keyring()
  const values: Record<string, unknown> = { fileCount: files.length, sealedBy: ring.active }
  const sealedSends = sends.map(withSealed)
  const sendColumns: [string, (s: BatchRow) => unknown][] = Object.entries(SEND_COLUMNS)
  const fileColumns: [string, (f: BatchFile) => unknown][] = Object.entries(FILE_COLUMNS)
  for (const [name, pick] of sendColumns) values[name] = sealedSends.map(pick)
  for (const [name, pick] of fileColumns) values[name] = files.map(pick)
  for (let i = 0; i < slots; i++) {
    const file = files[i]?.file
    const bytes = file?.bytes
    // A small file's one chunk, sealed as a staged chunk is (the first of its upload).
    values[`bytes${i}`] = file !== undefined && bytes !== undefined && bytes.length > 0 ? ring.seal(bytes, record.attachmentChunk(file.uploadId, 0)) : null
  }
  return values
}

/**
 * No lock wait longer than `ms` for the rest of the caller's transaction (SET LOCAL
 * lock_timeout): past it the statement fails with 55P03 and the transaction rolls back.
 */
export async function boundLockWaits (tx: Db, ms: number): Promise<void> {
  await tx.execute(sql.raw(`SET LOCAL lock_timeout = '${Math.round(ms)}ms'`))
}

/**
 * Holds the groups a batch sends to shared, in id order, until the transaction ends (call it
 * before writeBatch in the same transaction): membership changes take a group exclusively, so
 * the members writeBatch reads, with the fresh snapshot of a later statement, are the members
 * when it commits, and no message reaches a member removed meanwhile.
 */
export async function holdGroups (tx: Db, ids: string[]): Promise<void> {
  const sorted = sql.param([...new Set(ids)].sort())
  // The advisory lock first, as every holder of a group does (groups.repository.ts find): row
  // share locks alone join each other without queueing, so steady sends would starve a change.
  await queryPrepared(tx, sql`
    SELECT pg_advisory_xact_lock_shared(${GROUP_LOCK_CLASS}, hashtext(id)) FROM unnest(${sorted}::text[]) WITH ORDINALITY AS g(id, n) ORDER BY n`)
  await queryPrepared(tx, sql`SELECT id FROM groups WHERE id = ANY(${sorted}::text[]) ORDER BY id FOR SHARE`)
}

/**
 * Writes a batch of sends in one statement, so the batch costs one commit and one WAL flush
 * however many sends it holds; each send keeps its own outcome. Per send: a
 * recipient that is no user, or a deactivated one, writes nothing; a held Idempotency-Key with a live record writes nothing (the caller replays or
 * refuses); the rest ask for quota, but those of no key (keyId null), which go uncounted.
 *
 * Quota is asked per key, all or nothing: a key's n sends are counted together only if all n
 * fit under its limit (`count + n <= limit`), the row locked by the upsert, keys in order. When
 * they do not fit, none is counted and `keySends` tells the caller that more than one asked, so
 * it retries them one at a time and the count stays exact; a lone send refused is over quota.
 * A send to a group goes to each of its active members but the sender, and only if the sender
 * is a member. Counted sends then take their recipients' feed ids (a recipient of several sends
 * gets consecutive ids in batch order), user rows locked in address order after every quota row
 * (the same order as every other send, so sends never deadlock each other), and write the
 * message, a delivery row and a message.received event per recipient and, with an
 * Idempotency-Key, its record. Every feed that grew is announced once the batch has committed
 * (announcements.repository.ts), so listeners read the events visible.
 */
export async function writeBatch (db: Db, sends: BatchSend[], options: { lockWaitMs?: number } = {}): Promise<BatchOutcome[]> {
  const files = sends.flatMap((s, i) => s.files.map((file, j) => ({ ord: i + 1, n: j + 1, messageId: s.messageId, file })))
  // Parts a batch has no use for are left out of its statement: with no send to a group, the
  // member checks and the group fan-out; with no Idempotency-Key, the look-up and the record.
  // Each leaves out tables the statement would otherwise open and lock on every execution
  // (20 relations and indexes with them all, past the 16 PostgreSQL takes by its fast path).
  const toGroups = sends.some((s) => s.toGroup)
  const keyed = sends.some((s) => s.idempotencyKey !== undefined)
  // Files' bytes go one parameter each, in slots padded to a power of two (fileBytes).
  let slots = files.length === 0 ? 0 : 1
  while (slots < files.length) slots *= 2
  const lockWaitMs = options.lockWaitMs
  const shape = `send-batch ${toGroups ? 'groups' : 'users'} ${keyed ? 'keyed' : 'unkeyed'} ${slots} ${lockWaitMs ?? 'wait'}`
  const rows = await queryShaped<OutcomeRow>(db, shape, () => batchStatement(toGroups, keyed, slots, lockWaitMs),
    batchValues(sends, files, slots))
  announceGrowth(db, rows[0]?.fed ?? [])
  return rows.map((r) => ({
    found: r.found,
    deactivated: r.deactivated,
    member: r.member,
    earlierMessageId: r.earlier_id,
    earlierHash: r.earlier_hash,
    earlierSealedBy: r.earlier_sealed_by,
    keySends: r.key_sends ?? 0,
    used: r.used,
    written: r.written,
    createdAt: r.created_at,
    resetAt: Number(r.reset_at),
    fanOut: r.fan_out ?? 0
  }))
}

/** writeBatch's statement for one shape, its values as placeholders (batchValues). */
function batchStatement (toGroups: boolean, keyed: boolean, slots: number, lockWaitMs: number | undefined): SQL {
  const p = (name: keyof typeof SEND_COLUMNS | keyof typeof FILE_COLUMNS | 'sealedBy') => sql.placeholder(name)
  // A batch with files writes them in the same statement (a shape of its own, prepared apart):
  // each file's row; a small file's one chunk, which came whole with the request (an empty file
  // has none); a larger file's chunks, already staged, claimed for its message, so a refused send
  // claims nothing and they are deleted after.
  const withFiles: SQL = slots === 0
    ? sql``
    : sql`, files_in AS (
      SELECT * FROM unnest(${p('fileOrd')}::int[], ${p('fileN')}::int[], ${p('filename')}::text[],
        ${p('contentType')}::text[], ${p('size')}::int[], ${p('sha256')}::text[],
        ${p('uploadId')}::text[], ${fileBytes(slots)},
        ${p('staged')}::boolean[])
        AS f(ord, n, filename, content_type, size, sha256, upload_id, data, staged)
    ), filed AS (
      INSERT INTO attachments (message_id, n, filename, content_type, size, sha256, upload_id, sealed_by)
      SELECT sent.id, f.n, f.filename, f.content_type, f.size, f.sha256, f.upload_id, ${p('sealedBy')}::text FROM files_in f JOIN sent ON sent.ord = f.ord
    ), inline_chunks AS (
      INSERT INTO attachment_chunks (upload_id, seq, message_id, data, sealed_by)
      SELECT f.upload_id, 0, sent.id, f.data, ${p('sealedBy')}::text FROM files_in f JOIN sent ON sent.ord = f.ord WHERE f.data IS NOT NULL
    ), claimed AS (
      UPDATE attachment_chunks SET message_id = sent.id FROM files_in f JOIN sent ON sent.ord = f.ord
      WHERE f.staged AND attachment_chunks.upload_id = f.upload_id AND attachment_chunks.message_id IS NULL
    )`
  return sql`
    WITH input AS (
      SELECT * FROM unnest(${p('keyId')}::text[], ${p('lim')}::int[], ${p('sender')}::text[],
        ${p('recipient')}::text[], ${p('id')}::text[], ${p('body')}::text[], ${p('hashes')}::text[], ${p('replyTo')}::text[],
        ${p('data')}::text[], ${p('idemKey')}::text[],
        ${p('idemHash')}::text[], ${p('idemSealedBy')}::text[], ${p('held')}::boolean[], ${p('toGroup')}::boolean[])
        WITH ORDINALITY AS i(key_id, lim, sender, recipient, id, body, hashes, reply_to, data, idem_key, idem_hash, idem_sealed_by, held, to_group, ord)${lockWaitMs === undefined
      ? sql``
      : sql`
      -- lock_timeout for the rest of this statement's transaction (its own, alone, or the
      -- caller's): set before any row is locked, since every row it locks comes from input. No
      -- round trip of its own, so a batch to users stays one statement.
      WHERE (SELECT set_config('lock_timeout', ${sql.raw(`'${lockWaitMs}ms'`)}, true)) IS NOT NULL`}
    ), target AS (
      -- Each look-up by its key (LIMIT 1 keeps the planner from turning it into a join): the
      -- generic plan guesses ten input rows and would otherwise read every user to hash them.
      SELECT input.ord, u.deactivated_at IS NOT NULL AS deactivated FROM input
        CROSS JOIN LATERAL (SELECT deactivated_at FROM users WHERE users.address = input.recipient LIMIT 1) AS u
      WHERE NOT input.to_group
    ), ${toGroups
      ? sql`grouped AS (
      -- The membership by its key too: as an EXISTS, the generic plan hashed all of group_members
      -- on every batch while the table was small enough (and kept that plan until an ANALYZE).
      SELECT input.ord, m.member IS NOT NULL AS member
      FROM input CROSS JOIN LATERAL (SELECT 1 FROM groups WHERE groups.id = input.recipient LIMIT 1) AS g
        LEFT JOIN LATERAL (SELECT true AS member FROM group_members m
          WHERE m.group_id = input.recipient AND m.address = input.sender LIMIT 1) AS m ON true
      WHERE input.to_group
    )`
      : sql`grouped AS (SELECT NULL::bigint AS ord, false AS member WHERE false)`}, ${keyed
      ? sql`earlier AS (
      SELECT input.ord, k.message_id, k.request_hash, k.sealed_by FROM input
        CROSS JOIN LATERAL (SELECT message_id, request_hash, sealed_by FROM idempotency_keys
          -- The window by the database's clock, as purge counts it: never an instance's.
          WHERE key_id = input.key_id AND idempotency_key = input.idem_key
            AND created_at > now() - make_interval(secs => ${sql.raw(String(IDEMPOTENCY_WINDOW_MS / 1000))}) LIMIT 1) AS k
      WHERE input.held
    )`
      : sql`earlier AS (SELECT NULL::bigint AS ord, NULL::text AS message_id, NULL::text AS request_hash, NULL::text AS sealed_by WHERE false)`}, eligible AS (
      SELECT input.* FROM input
      WHERE (EXISTS (SELECT 1 FROM target WHERE target.ord = input.ord AND NOT target.deactivated)
          OR EXISTS (SELECT 1 FROM grouped WHERE grouped.ord = input.ord AND grouped.member))
        AND (input.idem_key IS NULL OR input.held) AND NOT EXISTS (SELECT 1 FROM earlier WHERE earlier.ord = input.ord)
    ), wanted AS (
      SELECT key_id, count(*)::int AS n, min(lim) AS lim FROM eligible WHERE key_id IS NOT NULL GROUP BY key_id
    ), counted AS (
      -- The day is the database's (its clock, in UTC), the same on every instance.
      INSERT INTO quota_usage AS q (key_id, day, count)
      SELECT key_id, (now() AT TIME ZONE 'UTC')::date, n FROM wanted WHERE n <= lim ORDER BY key_id
      ON CONFLICT (key_id, day) DO UPDATE SET count = q.count + excluded.count
        WHERE q.count + excluded.count <= (SELECT wanted.lim FROM wanted WHERE wanted.key_id = excluded.key_id)
      RETURNING key_id, count
    ), granted AS (
      SELECT eligible.*,
        counted.count - count(*) OVER (PARTITION BY eligible.key_id) + row_number() OVER (PARTITION BY eligible.key_id ORDER BY eligible.ord) AS used
      FROM eligible JOIN counted ON counted.key_id = eligible.key_id
      UNION ALL
      SELECT eligible.*, NULL::bigint AS used FROM eligible WHERE eligible.key_id IS NULL
    ), fanout AS (
      SELECT granted.ord, granted.recipient AS address FROM granted WHERE NOT granted.to_group${toGroups
      ? sql`
      UNION ALL
      SELECT granted.ord, m.address FROM granted JOIN group_members m ON m.group_id = granted.recipient
        JOIN users u ON u.address = m.address AND u.deactivated_at IS NULL
      WHERE granted.to_group AND m.address <> granted.sender`
      : sql``}
    ),
    -- After every quota row: granted's window functions sort all of eligible JOIN counted, so
    -- counted has run to completion (its rows locked) before fanout yields a row. Keep a
    -- window (or another full read of counted) in granted, or sends may deadlock each other.
    ${takeFeedIds(sql`fanout`)}, clock AS (
      SELECT at, to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"') AS iso
      FROM (SELECT date_trunc('milliseconds', now()) AS at) AS t
    ), sent AS (
      -- A send to a user is written only if its feed was taken (the user is still there); to a
      -- group, always, even when no other member receives it.
      -- Its event's data is sealed once, however many members receive it: a JSON string, whose
      -- message.createdAt the reader takes from the event's created_at (this statement's clock).
      SELECT granted.*, granted.data::jsonb AS event FROM granted
      WHERE granted.to_group OR EXISTS (SELECT 1 FROM feed WHERE feed.address = granted.recipient)
    ), last_ids AS (
      SELECT jsonb_object_agg(address, event_seq - n) AS ids FROM feed
    ), delivering AS (
      -- Each recipient's new ids follow its feed's last: looked up in a map of the feeds rather
      -- than joined (the generic plan, which guesses a few rows, joined them in a nested loop,
      -- quadratic in a group batch's recipients: 92,000 comparisons for 16 sends to 20).
      SELECT f.ord, f.address, ((SELECT ids FROM last_ids) ->> f.address)::bigint
        + row_number() OVER (PARTITION BY f.address ORDER BY f.ord) AS seq
      FROM fanout f WHERE (SELECT ids FROM last_ids) ? f.address
    ), by_ord AS (
      -- Each send's message id and event by its place in the batch (null when not written), for
      -- the rows per recipient to index rather than join: the generic plan joined them in a
      -- nested loop, recipients x sends. Element i is send i only while sent holds at most one
      -- row per ord (granted's two halves are disjoint; keep it so). A recipient's send is
      -- always written (its feed was taken): a null here could only fail a NOT NULL insert.
      SELECT array_agg(sent.id ORDER BY input.ord) AS ids, array_agg(sent.event ORDER BY input.ord) AS events
      FROM input LEFT JOIN sent ON sent.ord = input.ord
    ), written AS (
      INSERT INTO messages (id, sender, recipient, body, search_hashes, sealed_by, reply_to, created_at)
      SELECT sent.id, sent.sender, sent.recipient, sent.body, sent.hashes::int[], ${p('sealedBy')}::text, sent.reply_to, clock.at FROM sent, clock
      RETURNING id
    ), delivered AS (
      INSERT INTO deliveries (message_id, recipient) SELECT (SELECT ids FROM by_ord)[d.ord], d.address FROM delivering d
    ), appended AS (
      INSERT INTO events (address, seq, type, data, sealed_by, message_id, created_at)
      SELECT d.address, d.seq, 'message.received', (SELECT events FROM by_ord)[d.ord], ${p('sealedBy')}::text, (SELECT ids FROM by_ord)[d.ord], clock.at
      FROM delivering d, clock
    )${keyed
      ? sql`, remembered AS (
      INSERT INTO idempotency_keys AS r (key_id, idempotency_key, request_hash, sealed_by, message_id)
      SELECT sent.key_id, sent.idem_key, sent.idem_hash, sent.idem_sealed_by, sent.id FROM sent WHERE sent.idem_key IS NOT NULL
      ON CONFLICT (key_id, idempotency_key) DO UPDATE SET request_hash = excluded.request_hash, sealed_by = excluded.sealed_by,
        message_id = excluded.message_id, created_at = now()
    )`
      : sql``}${withFiles}
    SELECT input.ord::int AS ord, target.ord IS NOT NULL OR grouped.ord IS NOT NULL AS found, coalesce(target.deactivated, false) AS deactivated,
      coalesce(grouped.member, false) AS member,
      earlier.message_id AS earlier_id, earlier.request_hash AS earlier_hash, earlier.sealed_by AS earlier_sealed_by, wanted.n AS key_sends, granted.used::int AS used,
      written.id IS NOT NULL AS written, (SELECT iso FROM clock) AS created_at,
      extract(epoch FROM date_trunc('day', now() AT TIME ZONE 'UTC') + interval '1 day')::bigint AS reset_at,
      fanned.n AS fan_out, CASE WHEN input.ord = 1 THEN (SELECT array_agg(address) FROM feed) END AS fed
    FROM input
      LEFT JOIN target ON target.ord = input.ord
      LEFT JOIN grouped ON grouped.ord = input.ord
      LEFT JOIN earlier ON earlier.ord = input.ord
      LEFT JOIN eligible ON eligible.ord = input.ord
      LEFT JOIN wanted ON wanted.key_id = eligible.key_id
      LEFT JOIN granted ON granted.ord = input.ord
      LEFT JOIN written ON written.id = granted.id
      LEFT JOIN (SELECT ord, count(*)::int AS n FROM fanout GROUP BY ord) AS fanned ON fanned.ord = input.ord AND written.id IS NOT NULL
    ORDER BY input.ord`
}
