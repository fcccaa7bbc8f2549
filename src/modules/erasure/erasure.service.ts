import type { Db } from '../../db/client.js'
import { createEventsRepository } from '../events/events.repository.js'
import { removeErasedMember } from '../groups/groups.service.js'
import { createGroupsRepository } from '../groups/groups.repository.js'
import { createKeysRepository } from '../keys/keys.repository.js'
import { createIdempotencyRepository } from '../messages/idempotency.repository.js'
import { deleteManyForEveryone } from '../messages/delete.service.js'
import { createMessagesRepository } from '../messages/messages.repository.js'
import { createReactionFanoutsRepository } from '../messages/reaction-fanouts.repository.js'
import { createMetadataRepository } from '../metadata/metadata.repository.js'
import { createQuotaRepository } from '../quota/quota.repository.js'
import { createRosterRepository } from '../roster/roster.repository.js'
import { createWebhooksRepository } from '../webhooks/webhooks.repository.js'

/** How much one erasure batch (one transaction) may do: each bound keeps the transaction short. */
export interface ErasureBatch {
  /** Messages the user sent, erased per transaction (as retention purges them). */
  messages: number
  /** Rows of every other kind per transaction: reactions, delivery rows, roster entries, feed events, groups. */
  rows: number
  /**
   * Events one transaction may write to other users' feeds (message.deleted for each recipient,
   * group changes for each member): a batch stops early rather than fan out without bound.
   */
  events: number
}

export const ERASURE_BATCH: ErasureBatch = { messages: 500, rows: 1000, events: 5000 }

/** Groups one transaction visits at most (each is locked as a membership change locks it). */
const GROUPS_PER_BATCH = 100

/**
 * The erasure's steps, in order, each removing at most one batch of what is left of one kind
 * and answering how much it removed (0: nothing of that kind is left). Every step selects afresh
 * what remains, so a batch killed half-way (rolled back) or run twice does no harm, and
 * whatever lands late (a send its keys made before the deactivation reached every instance) is
 * found by the next look.
 */
const STEPS: { name: string, run: (tx: Db, address: string, batch: ErasureBatch) => Promise<number> }[] = [
  { name: 'messages', run: eraseSentMessages },
  { name: 'reactions', run: eraseReactions },
  { name: 'groups', run: leaveGroups },
  { name: 'deliveries', run: async (tx, address, batch) => createMessagesRepository(tx).removeDeliveriesOf(address, batch.rows) },
  { name: 'roster', run: async (tx, address, batch) => createRosterRepository(tx).removeOwnedBy(address, batch.rows) },
  { name: 'feed', run: async (tx, address, batch) => createEventsRepository(tx).removeOldest(address, batch.rows) },
  { name: 'credentials', run: eraseCredentials }
]

/**
 * One batch of `address`'s erasure, in the caller's transaction: the first step with anything
 * left does one batch. Answers which step and how much, or undefined when nothing is left.
 */
export async function eraseNextBatch (tx: Db, address: string, batch: ErasureBatch): Promise<{ step: string, removed: number } | undefined> {
  for (const step of STEPS) {
    const removed = await step.run(tx, address, batch)
    if (removed > 0) return { step: step.name, removed }
  }
  return undefined
}

/**
 * Messages the user sent, erased for everyone as its own delete erases them
 * (delete.service.ts): the oldest `messages`, fewer when they reached more than `events`
 * recipients in all.
 */
async function eraseSentMessages (tx: Db, address: string, batch: ErasureBatch): Promise<number> {
  const ids = await createMessagesRepository(tx).lockSentBy(address, batch.messages, batch.events)
  await deleteManyForEveryone(tx, ids)
  return ids.length
}

/**
 * Its reactions to others' messages, with the message.reaction events about them (which carry
 * its emoji) in every feed. Nothing new is told: a "removed" event would carry the emoji again;
 * the counts others see change on their next read.
 */
async function eraseReactions (tx: Db, address: string, batch: ErasureBatch): Promise<number> {
  // First its events still queued for telling, so none is told after the copies are erased
  // (with the copies already told of a queued one it has since taken back).
  const queued = await createReactionFanoutsRepository(tx).forgetBy(address)
  const ids = await createMessagesRepository(tx).removeReactionsBy(address, batch.rows)
  await createEventsRepository(tx).eraseReactionsFrom(address, [...new Set([...queued, ...ids])])
  return queued.length + ids.length
}

/** Its memberships, ending as leaving ends one; groups it owns pass on or go (removeErasedMember). */
async function leaveGroups (tx: Db, address: string, batch: ErasureBatch): Promise<number> {
  const ids = await createGroupsRepository(tx).ofMemberOrOwner(address, Math.min(GROUPS_PER_BATCH, batch.rows))
  let told = 0
  let left = 0
  for (const id of ids) {
    if (left > 0 && told >= batch.events) break
    told += await removeErasedMember(tx, id, address)
    left++
  }
  return left
}

/**
 * The last of it: the metadata about the user, its webhooks (with their delivery logs), its keys
 * (with their acknowledgements), and the quota counts and Idempotency-Key records of those keys.
 */
async function eraseCredentials (tx: Db, address: string): Promise<number> {
  const metadata = await createMetadataRepository(tx).remove(address)
  const webhooks = await createWebhooksRepository(tx).removeAllOf(address)
  const keyIds = await createKeysRepository(tx).removeAllOf(address)
  await createQuotaRepository(tx).forget(keyIds)
  await createIdempotencyRepository(tx).forget(keyIds)
  return metadata + webhooks + keyIds.length
}
