import { Forbidden, NotFound } from '../../errors.js'
import type { MessagesRepository } from './messages.repository.js'
import type { MessageRow } from './messages.table.js'

export type Role = 'sender' | 'recipient'

/**
 * A message as `address` may see it: its sender, or a recipient that has not hidden it.
 * Unknown (or hidden from this recipient): 404. Anyone else: 403.
 */
export async function readableMessage (messages: MessagesRepository, id: string, address: string): Promise<{ row: MessageRow, role: Role }> {
  const row = await messages.find(id)
  if (row === undefined) throw new NotFound('message', id)
  if (row.sender === address) return { row, role: 'sender' }
  const delivery = await messages.delivery(id, address)
  if (delivery === undefined) {
    // Deleted between the two reads (its deliveries went with it): gone, not forbidden.
    if (await messages.find(id) === undefined) throw new NotFound('message', id)
    throw new Forbidden(`message ${id} is visible only to its sender and recipients`)
  }
  if (delivery.hiddenAt !== null) throw new NotFound('message', id)
  return { row, role: 'recipient' }
}
