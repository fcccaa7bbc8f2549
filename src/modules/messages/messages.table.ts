import { getTableColumns, sql } from 'drizzle-orm'
import { bigint, customType, index, integer, jsonb, pgTable, primaryKey, text } from 'drizzle-orm/pg-core'
import { timestamptz } from '../../db/columns.js'
import { users } from '../users/users.table.js'

const bytea = customType<{ data: Buffer }>({ dataType: () => 'bytea' })
// Kept as PostgreSQL's array text ('{1,-2}'): written from Node, read by no one but the index.
const hashArray = customType<{ data: string }>({ dataType: () => 'integer[]' })

export const messages = pgTable('messages', {
  id: text('id').primaryKey(),
  sender: text('sender').notNull().references(() => users.address, { onDelete: 'cascade' }),
  // A user address or a group id (grp_…); the two never collide since addresses exclude "_".
  recipient: text('recipient').notNull(),
  body: text('body').notNull(),
  createdAt: timestamptz('created_at').notNull().defaultNow(),
  // Set by PATCH /message/{id}: when the body was last replaced.
  editedAt: timestamptz('edited_at'),
  // The message of the same conversation this one answers (POST /message's replyTo). No key: a
  // reply keeps naming a message deleted since, as a client shows "deleted".
  replyTo: text('reply_to'),
  // Sealed at rest (src/sealing): the body is base64 of its ciphertext under the key named by
  // sealed_by (NULL: written before sealing, plain until the sealing pass reaches it).
  sealedBy: text('sealed_by'),
  // Search without the words (POST /search, API.md §11): keyed 32-bit hashes of each word's
  // prefixes from 2 to 12 characters and of each whole word of up to 12
  // (src/sealing/search-terms.ts), under the search key of sealed_by's key. The table holds no
  // word, only hashes of them; the index finds candidates and the search keeps those whose
  // opened body holds the words.
  searchHashes: hashArray('search_hashes').notNull().default(sql`'{}'::integer[]`)
}, (t) => [
  index('messages_sender_created_idx').on(t.sender, t.createdAt),
  index('messages_recipient_created_idx').on(t.recipient, t.createdAt),
  // Retention (MESSAGE_RETENTION_DAYS): each purge batch takes the oldest few hundred from its
  // start, rather than reading the table; new rows go at its end, the cheapest insert a btree has.
  // On an expression only the purge names (AGE_KEY), not on created_at itself: a plain index
  // would offer every "newest first ... LIMIT" query (search, conversations) a backward scan
  // that reads the whole table when its filter matches little.
  index('messages_age_idx').on(sql`(created_at AT TIME ZONE 'UTC')`),
  // A conversation's history in id order (GET /conversations/{peer}/messages): a 1:1
  // conversation is two runs of this index, one each way; a group's, the caller's own run and
  // the group's below. A page reads about its own length of each.
  index('messages_conversation_idx').on(t.sender, t.recipient, t.id),
  index('messages_group_history_idx').on(t.recipient, t.id).where(sql`recipient LIKE 'grp\\_%'`),
  // A small pending list (256 kB): new words are appended, then merged into the index sorted, a
  // few hundred messages at a time, cheaper per message than each word into its posting tree at
  // once. Small, since the insert that finds the list full merges it while its batch waits: the
  // 4 MB default made that 80-200 ms (migrations 0010, 0012).
  index('messages_search_idx').using('gin', t.searchHashes).with({ fastupdate: true, gin_pending_list_limit: 256 })
])

export const attachments = pgTable('attachments', {
  messageId: text('message_id').notNull().references(() => messages.id, { onDelete: 'cascade' }),
  // 1-based, in upload order: GET /message/{id}/attachment/{n}.
  n: integer('n').notNull(),
  filename: text('filename').notNull(),
  contentType: text('content_type').notNull(),
  size: integer('size').notNull(),
  sha256: text('sha256').notNull(),
  // The file's bytes are its chunks in attachment_chunks under this id.
  uploadId: text('upload_id').notNull(),
  // The key filename, content_type and sha256 are sealed under (base64 each); NULL: plain.
  sealedBy: text('sealed_by')
}, (t) => [primaryKey({ columns: [t.messageId, t.n] })])

/**
 * A file's bytes in fixed-size chunks (CHUNK_BYTES, the last one shorter), staged one short
 * autocommit insert at a time while the upload streams in, so no connection is held while the
 * client is still sending. The send claims them by setting message_id in its own statement; from
 * then on they go with the message by cascade. Unclaimed rows are a refused or aborted upload:
 * deleted when the request ends, or swept by retention after a crash.
 */
export const attachmentChunks = pgTable('attachment_chunks', {
  uploadId: text('upload_id').notNull(),
  seq: integer('seq').notNull(),
  messageId: text('message_id').references(() => messages.id, { onDelete: 'cascade' }),
  stagedAt: timestamptz('staged_at').notNull().defaultNow(),
  // The chunk sealed whole (nonce, ciphertext, tag) under this key: the unit a Range read opens; NULL: plain.
  data: bytea('data').notNull(),
  sealedBy: text('sealed_by')
}, (t) => [
  primaryKey({ columns: [t.uploadId, t.seq] }),
  index('attachment_chunks_message_idx').on(t.messageId),
  index('attachment_chunks_unclaimed_idx').on(t.stagedAt).where(sql`message_id IS NULL`)
])

/**
 * One row per recipient of a message: its delivery status, and whether it hid the message.
 * Without foreign keys, like events: deliveries are written only by the send's statement, with
 * the message it inserts and for recipients whose rows it has locked taking their feed ids, so
 * the two key checks a row (a send to a group of 20: 38, and the message row locked) proved
 * nothing new and cost a quarter of PostgreSQL's time. Deleting a message or a user deletes
 * its deliveries by trigger (migration 0013), as the keys' cascades did.
 */
export const deliveries = pgTable('deliveries', {
  messageId: text('message_id').notNull(),
  recipient: text('recipient').notNull(),
  status: text('status', { enum: ['sent', 'delivered', 'read'] }).notNull().default('sent'),
  updatedAt: timestamptz('updated_at').notNull().defaultNow(),
  hiddenAt: timestamptz('hidden_at')
}, (t) => [
  primaryKey({ columns: [t.messageId, t.recipient] }),
  index('deliveries_recipient_idx').on(t.recipient, t.messageId),
  // A recipient's unread messages, in id order: "read up to here" (POST /conversations/{peer}/read)
  // touches these and no message already read, however long the conversation.
  index('deliveries_unread_idx').on(t.recipient, t.messageId).where(sql`status <> 'read'`)
])

/**
 * Who reacted to a message with which emoji (PUT /message/{id}/reactions/{emoji}): one row per
 * reactor and emoji, going with the message (and with the reactor's user) by cascade.
 */
export const messageReactions = pgTable('message_reactions', {
  messageId: text('message_id').notNull().references(() => messages.id, { onDelete: 'cascade' }),
  emoji: text('emoji').notNull(),
  address: text('address').notNull().references(() => users.address, { onDelete: 'cascade' }),
  createdAt: timestamptz('created_at').notNull().defaultNow()
}, (t) => [
  primaryKey({ columns: [t.messageId, t.emoji, t.address] }),
  index('message_reactions_address_idx').on(t.address)
])

/**
 * A reaction's message.reaction still to be told to the message's readers
 * (reaction-fanouts.repository.ts): written with the reaction, in its transaction, when the
 * message has more readers than one bounded transaction tells; then told in transactions of at
 * most FANOUT_CHUNK feeds each, in address order after `toldThrough`, and deleted with its last.
 * The reacting request tells its own before it answers; a row a stopped process left is told by
 * the next sweep. Goes with the message by cascade.
 */
export const reactionFanouts = pgTable('reaction_fanouts', {
  id: bigint('id', { mode: 'number' }).primaryKey().generatedAlwaysAsIdentity(),
  messageId: text('message_id').notNull().references(() => messages.id, { onDelete: 'cascade' }),
  // The event's data, as every copy of it says.
  data: jsonb('data').notNull(),
  // The reactor, who is not told.
  reactor: text('reactor').notNull(),
  // The last address told so far (NULL: none yet).
  toldThrough: text('told_through'),
  createdAt: timestamptz('created_at').notNull().defaultNow()
}, (t) => [
  // A message's fan-outs oldest first: each is told whole before the next, so a feed hears a
  // message's reactions in the order they were made.
  index('reaction_fanouts_message_idx').on(t.messageId, t.id)
])

/** A stored message's columns but its search hashes, which only the index reads. */
const { searchHashes: _searchHashes, ...storedColumns } = getTableColumns(messages)
export const messageColumns = storedColumns

/** A message as the repositories answer it: the body opened (message-body.ts). */
export type MessageRow = Omit<typeof messages.$inferSelect, 'searchHashes'>
export type AttachmentRow = typeof attachments.$inferSelect
export type DeliveryStatus = 'sent' | 'delivered' | 'read'
