import type { Db } from '../../db/client.js'
import { transaction } from '../../db/transaction.js'
import { AppError, NotFound, ValidationFailed } from '../../errors.js'
import { createEventsRepository } from '../events/events.repository.js'
import { readableMessage } from './access.service.js'
import { createMessagesRepository } from './messages.repository.js'
import { REACTION_EMOJI } from './messages.schemas.js'

/** The most distinct emoji one message may carry (API.md §10). */
const MAX_REACTIONS_PER_MESSAGE = 20

function checkedEmoji (emoji: string): string {
  if (!REACTION_EMOJI.test(emoji)) {
    throw new ValidationFailed(`emoji: ${JSON.stringify(emoji)} must be 1–32 characters with no whitespace or control characters`)
  }
  return emoji
}

/**
 * PUT (added) or DELETE (not added) /message/{id}/reactions/{emoji}, for whoever may read the
 * message; idempotent: only a change is written and told. The message's row is locked (no key
 * update: reactions to one message take turns, so the 20-emoji bound and the counts are exact,
 * without waiting on a reader), then the change, then one message.reaction to its sender and
 * each recipient that still has it, the reactor aside, in the same transaction. Its cost grows
 * with the conversation (999 events in a 1,000-member group), so the routes take the heavy
 * admission gate: one at a time per key.
 */
export async function react (db: Db, id: string, address: string, rawEmoji: string, added: boolean): Promise<void> {
  const emoji = checkedEmoji(rawEmoji)
  await transaction(db, async (tx) => {
    const messages = createMessagesRepository(tx)
    // Locked, then checked: a hide or delete that commits first is seen.
    if (await messages.lock(id, 'no key update') === undefined) throw new NotFound('message', id)
    const { row } = await readableMessage(messages, id, address)
    let changed: boolean
    if (added) {
      const { distinct, has } = await messages.reactionKinds(id, emoji)
      if (!has && distinct >= MAX_REACTIONS_PER_MESSAGE) {
        throw new AppError(409, 'CONFLICT', `message ${id} already has ${MAX_REACTIONS_PER_MESSAGE} different reactions; react with one of them`)
      }
      changed = await messages.addReaction(id, emoji, address)
    } else {
      changed = await messages.removeReaction(id, emoji, address)
    }
    if (!changed) return
    const told = [row.sender, ...await messages.readers(id)].filter((a) => a !== address)
    // One data for every copy: append writes it once.
    const data = { message: id, emoji, from: address, added }
    await createEventsRepository(tx).append([...new Set(told)].map((to) => ({ address: to, type: 'message.reaction', data, messageId: id })))
  })
}
