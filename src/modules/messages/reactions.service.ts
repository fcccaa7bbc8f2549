import type { FastifyBaseLogger } from 'fastify'
import type { Db } from '../../db/client.js'
import { loggableError } from '../../db/errors.js'
import { transaction } from '../../db/transaction.js'
import { AppError, NotFound, ValidationFailed } from '../../errors.js'
import { createEventsRepository } from '../events/events.repository.js'
import { readableMessage } from './access.service.js'
import { createMessagesRepository } from './messages.repository.js'
import { createReactionFanoutsRepository, FANOUT_CHUNK } from './reaction-fanouts.repository.js'
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
 * each recipient that still has it, the reactor aside. Up to FANOUT_CHUNK of them are told in
 * the same transaction; to more, the event is queued in it (reaction_fanouts) and told in
 * transactions of FANOUT_CHUNK feeds before the request answers (should telling fail part way,
 * the answer is still the reaction's, and the sweep tells the rest), so no one transaction of a
 * 1,000-member group's reaction holds the WAL in front of other keys' commits. The routes take
 * the heavy admission gate: one at a time per key.
 */
export async function react (db: Db, log: FastifyBaseLogger, id: string, address: string, rawEmoji: string, added: boolean): Promise<void> {
  const emoji = checkedEmoji(rawEmoji)
  let queued: number | undefined
  await transaction(db, async (tx) => {
    // A run again after a deadlock starts over.
    queued = undefined
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
    const data = { message: id, emoji, from: address, added }
    const fanouts = createReactionFanoutsRepository(tx)
    // Enough readers to tell whether there are more than FANOUT_CHUNK to tell, the sender and
    // the reactor aside: a queued fan-out reads its own, a chunk at a time.
    const told = [...new Set([row.sender, ...await messages.readers(id, FANOUT_CHUNK + 2)])].filter((a) => a !== address)
    // Behind a queued fan-out of this message, queued too: its readers hear its reactions in order.
    if (told.length > FANOUT_CHUNK || await fanouts.pending(id)) {
      queued = await fanouts.enqueue(id, data, address)
      return
    }
    // One data for every copy: append writes it once.
    await createEventsRepository(tx).append(told.map((to) => ({ address: to, type: 'message.reaction', data, messageId: id })))
  })
  if (queued === undefined) return
  try {
    await tellQueued(db, id, queued)
  } catch (err) {
    // The reaction has committed: the answer says so. Its readers not yet told are told by the
    // next sweep (reaction-fanouts.plugin.ts), as if this process had stopped here.
    log.error({ err: loggableError(err), message: id }, 'telling a reaction failed part way; the fan-out sweep tells the rest')
  }
}

/**
 * Tells `messageId`'s queued fan-outs, oldest first, until the one numbered `until` is told
 * whole (every one before it was, then), until none is left, or until `signal` aborts (between
 * two transactions).
 */
async function tellQueued (db: Db, messageId: string, until: number, signal?: AbortSignal): Promise<void> {
  const fanouts = createReactionFanoutsRepository(db)
  while (signal?.aborted !== true) {
    const step = await fanouts.tellNext(messageId)
    if (step === undefined || (step.done && step.id >= until)) return
  }
}

/**
 * Tells the fan-outs begun more than `olderThanMs` ago, which their requests left (the process
 * stopped, or telling failed, between the reaction's commit and its last transaction of
 * telling): the 100 messages with the oldest, each up to its newest at the time of looking
 * (fan-outs queued since are their requests' to tell). A message whose telling fails is logged
 * and left for the next look, and the others are told. Stops between two transactions once
 * `signal` aborts. Answers how many messages it told whole.
 */
export async function tellLeftFanouts (db: Db, log: FastifyBaseLogger, olderThanMs: number, signal?: AbortSignal): Promise<number> {
  const left = await createReactionFanoutsRepository(db).stale(olderThanMs, 100)
  const stopped = () => signal?.aborted === true
  let told = 0
  for (const { messageId, newest } of left) {
    if (stopped()) break
    try {
      await tellQueued(db, messageId, newest, signal)
      if (!stopped()) told++
    } catch (err) {
      log.error({ err: loggableError(err), message: messageId }, 'telling a reaction fan-out a request left failed; the next sweep tries again')
    }
  }
  return told
}
