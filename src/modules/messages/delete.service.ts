import type { Db } from '../../db/client.js'
import { transaction } from '../../db/transaction.js'
import { NotFound } from '../../errors.js'
import { createEventsRepository } from '../events/events.repository.js'
import { createMetadataRepository } from '../metadata/metadata.repository.js'
import { readableMessage } from './access.service.js'
import { createMessagesRepository } from './messages.repository.js'

/**
 * DELETE /message/{id}. The sender erases it for everyone in one transaction: every feed's
 * copy of its body, the message with its files and delivery rows, and a message.deleted event
 * to each recipient. A recipient hides it from itself and, in the same transaction, erases its
 * own feed's copy of the body.
 *
 * The message's row is locked first (for update by the sender, shared by a recipient), so a
 * delete waits for an edit in flight and then erases the copies of the body it wrote; then
 * events before deliveries (as the test bot does: its feed's events, then the delivery it marks
 * read), so a delete never deadlocks a hide, another delete, an edit or the bot. A deadlock or serialization failure with other
 * work (a pooler's default isolation, an operator's transaction) is run again (db/transaction.ts),
 * never answered 500.
 */
export async function deleteMessage (db: Db, id: string, address: string): Promise<void> {
  const { role } = await readableMessage(createMessagesRepository(db), id, address)
  await transaction(db, async (tx) => {
    const messages = createMessagesRepository(tx)
    const events = createEventsRepository(tx)
    if (await messages.lock(id, role === 'sender' ? 'update' : 'share') === undefined) throw new NotFound('message', id)
    if (role === 'recipient') {
      await events.eraseCopies([id], address)
      await messages.hide(id, address)
      return
    }
    await events.eraseCopies([id])
    // Of racing deletes only the one that removed the row tells the recipients; the others
    // found it gone, as a delete after it would.
    const recipients = await messages.remove(id)
    if (recipients === undefined) throw new NotFound('message', id)
    // Metadata about the message goes with it, in this transaction.
    await createMetadataRepository(tx).remove(id)
    await events.append(recipients.map((recipient) => ({ address: recipient, type: 'message.deleted', data: { message: id } })))
  })
}

/**
 * Deletes these messages (locked by the caller) for everyone, as their sender's delete does one
 * and in the same order: every feed's copy of their bodies, the messages with their files,
 * reactions, delivery rows and search entries, their metadata, then message.deleted to each
 * recipient each had. In the caller's transaction (an erasure's batch).
 */
export async function deleteManyForEveryone (tx: Db, ids: string[]): Promise<void> {
  if (ids.length === 0) return
  const events = createEventsRepository(tx)
  await events.eraseCopies(ids)
  const recipients = await createMessagesRepository(tx).removeManyTelling(ids)
  await createMetadataRepository(tx).remove(...ids)
  await events.append(recipients.map((r) => ({ address: r.recipient, type: 'message.deleted', data: { message: r.messageId } })))
}

/**
 * Retention: one batch of at most `batch` messages past the retention that applies to them
 * (MESSAGE_RETENTION_DAYS as `days`, or their group's own when shorter), erased as a sender's
 * delete erases one and in the same order (the messages locked, then every feed's events
 * about them, then the messages with their files, reactions, deliveries and search entries,
 * then their metadata), in the caller's transaction. No message.deleted event: a purge of old
 * messages is not news, and would flood every feed with one event per message. Answers how
 * many messages it took.
 */
export async function purgeExpiredMessages (tx: Db, days: number | undefined, batch: number): Promise<number> {
  const messages = createMessagesRepository(tx)
  const ids = await messages.lockExpired(days, batch)
  if (ids.length === 0) return 0
  await createEventsRepository(tx).eraseMessages(ids)
  const removed = await messages.removeMany(ids)
  await createMetadataRepository(tx).remove(...ids)
  return removed
}
