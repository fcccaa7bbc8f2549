import type { Db } from '../../db/client.js'
import { transaction } from '../../db/transaction.js'
import { NotFound } from '../../errors.js'
import { isGroupId } from '../../ids.js'
import { createEventsRepository } from '../events/events.repository.js'
import { createGroupsRepository } from '../groups/groups.repository.js'
import { memberGroup } from '../groups/groups.service.js'
import { createUsersRepository } from '../users/users.repository.js'
import { RecipientDeactivated } from './send.errors.js'
import { userAddress } from './send.service.js'

/** How long a typing event (started or stopped) holds before it lapses. */
const TYPING_TTL_MS = 15_000

/**
 * Group typing fans out to every member, so it is coalesced per (sender, group) in this
 * process: a typing.started is not sent again while the previous one still has more than half
 * its TTL to live, and a typing.stopped only follows a live start. Maps sender|group to the
 * live start's expiry (ms since the epoch, database clock).
 */
const liveGroupTyping = new Map<string, number>()

/**
 * Who a typing indicator goes to: a user itself, or every member of a group but the sender, who
 * must be a member. Inside a transaction the group is held shared, so a membership change cannot
 * interleave and an indicator never reaches a non-member.
 */
async function resolveRecipients (db: Db, sender: string, recipient: string): Promise<{ recipient: string, addresses: string[] }> {
  if (isGroupId(recipient)) {
    const groups = createGroupsRepository(db)
    await memberGroup(groups, recipient, sender, 'share')
    return { recipient, addresses: (await groups.activeMembers(recipient)).filter((a) => a !== sender) }
  }
  const address = userAddress(recipient)
  const user = await createUsersRepository(db).find(address)
  if (user === undefined) throw new NotFound('user', address)
  if (user.deactivatedAt !== null) throw new RecipientDeactivated(address)
  return { recipient: address, addresses: [address] }
}

/** Forgets lapsed entries, so the map holds only live starts. */
function sweep (now: number): void {
  for (const [key, expires] of liveGroupTyping) if (expires <= now) liveGroupTyping.delete(key)
}

/**
 * Whether typing to `target` goes anywhere: to a group always (the sender is a member, or
 * resolveRecipients refused); to a user only when that user knows the sender (acquainted).
 * Typing to a stranger is answered 204 and dropped: no event, so no webhook delivery either,
 * and nothing tells the caller whether the user knows it.
 */
async function reaches (tx: Db, from: string, target: { recipient: string }): Promise<boolean> {
  return isGroupId(target.recipient) || await createUsersRepository(tx).acquainted(from, target.recipient)
}

/** typing.started to the recipient (or each other member of a group), lapsing after 15 s. */
export async function startTyping (db: Db, from: string, to: string): Promise<void> {
  await transaction(db, async (tx) => {
    const target = await resolveRecipients(tx, from, to)
    if (!await reaches(tx, from, target)) return
    const feeds = createEventsRepository(tx)
    const expiresAt = await feeds.expiryAfter(TYPING_TTL_MS)
    const key = `${from}|${target.recipient}`
    if (isGroupId(target.recipient)) {
      const now = expiresAt.getTime() - TYPING_TTL_MS
      sweep(now)
      const live = liveGroupTyping.get(key)
      if (live !== undefined && live - now > TYPING_TTL_MS / 2) return
    }
    const data = { from, to: target.recipient, expiresAt: expiresAt.toISOString() }
    await feeds.append(target.addresses.map((address) => ({ address, type: 'typing.started', data, expiresAt })))
    if (isGroupId(target.recipient)) liveGroupTyping.set(key, expiresAt.getTime())
  })
}

/** typing.stopped, lapsing like a start: it only matters while a start could still be shown. */
export async function stopTyping (db: Db, from: string, to: string): Promise<void> {
  await transaction(db, async (tx) => {
    const target = await resolveRecipients(tx, from, to)
    if (!await reaches(tx, from, target)) return
    const feeds = createEventsRepository(tx)
    const expiresAt = await feeds.expiryAfter(TYPING_TTL_MS)
    if (isGroupId(target.recipient)) {
      const key = `${from}|${target.recipient}`
      sweep(expiresAt.getTime() - TYPING_TTL_MS)
      if (!liveGroupTyping.has(key)) return
      liveGroupTyping.delete(key)
    }
    const data = { from, to: target.recipient }
    await feeds.append(target.addresses.map((address) => ({ address, type: 'typing.stopped', data, expiresAt })))
  })
}
