import type { Db } from '../../db/client.js'
import { transaction } from '../../db/transaction.js'
import { Forbidden, NotFound } from '../../errors.js'
import { createEventsRepository } from '../events/events.repository.js'
import { readableMessage } from './access.service.js'
import { createMessagesRepository } from './messages.repository.js'
import type { MessageStatus } from './messages.schemas.js'

/** The sender sees every recipient's status; a recipient sees only its own. */
export async function messageStatus (db: Db, id: string, address: string): Promise<MessageStatus> {
  const messages = createMessagesRepository(db)
  const { role } = await readableMessage(messages, id, address)
  let rows
  if (role === 'sender') rows = await messages.deliveries(id)
  else {
    // Deleted since the access check: the delivery row went with it (#14.4).
    const own = await messages.delivery(id, address)
    if (own === undefined) throw new NotFound('message', id)
    rows = [own]
  }
  return {
    message: id,
    recipients: rows.map((r) => ({ address: r.recipient, status: r.status, updatedAt: r.updatedAt.toISOString() }))
  }
}

/**
 * Moves one recipient's status forward inside the caller's transaction and, when it changed,
 * tells the sender (message.status). Returns whether it changed.
 */
export async function advanceStatus (tx: Db, message: { id: string, sender: string }, recipient: string, status: 'delivered' | 'read'): Promise<boolean> {
  const changed = await createMessagesRepository(tx).advance(message.id, recipient, status)
  if (changed) {
    await createEventsRepository(tx).append([{
      address: message.sender, type: 'message.status', data: { message: message.id, recipient, status }, messageId: message.id
    }])
  }
  return changed
}

/**
 * A recipient reports delivered or read. Status only moves forward; a change tells the sender
 * (message.status) in the same transaction, a report that is not ahead changes nothing.
 */
export async function reportStatus (db: Db, id: string, address: string, status: 'delivered' | 'read'): Promise<void> {
  const { row, role } = await readableMessage(createMessagesRepository(db), id, address)
  if (role === 'sender' && await createMessagesRepository(db).delivery(id, address) === undefined) {
    throw new Forbidden(`only a recipient of message ${id} may report its status`)
  }
  await transaction(db, async (tx) => { await advanceStatus(tx, row, address, status) })
}
