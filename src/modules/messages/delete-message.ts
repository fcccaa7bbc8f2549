import type { Db } from '../../db/client.js'
import { createEventsRepository } from '../events/events.repository.js'
import { readableMessage } from './message-access.js'
import { createMessagesRepository } from './messages.repository.js'

/**
 * DELETE /message/{id}. The sender erases it for everyone in one transaction: the message,
 * its files and delivery rows, every feed's copy of its body, and a message.deleted event to
 * each recipient. A recipient only hides it from itself.
 */
export async function deleteMessage (db: Db, id: string, address: string): Promise<void> {
  const { role } = await readableMessage(createMessagesRepository(db), id, address)
  if (role === 'recipient') {
    await createMessagesRepository(db).hide(id, address)
    return
  }
  await db.transaction(async (tx) => {
    const messages = createMessagesRepository(tx)
    const recipients = (await messages.deliveries(id)).map((d) => d.recipient)
    const events = createEventsRepository(tx)
    await events.eraseMessage(id)
    await messages.remove(id)
    await events.append(recipients.map((recipient) => ({ address: recipient, type: 'message.deleted', data: { message: id } })))
  })
}
