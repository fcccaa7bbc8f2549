import type { Db } from '../../db/client.js'
import { transaction } from '../../db/transaction.js'
import { NotFound, RATE_LIMIT_MESSAGE, RateLimited } from '../../errors.js'
import { isGroupId } from '../../ids.js'
import { createEventsRepository } from '../events/events.repository.js'
import { createGroupsRepository } from '../groups/groups.repository.js'
import { memberGroup } from '../groups/groups.service.js'
import { createUsersRepository } from '../users/users.repository.js'
import { FeedWriteBudget } from './feed-write-budget.js'
import { RecipientDeactivated } from './send.errors.js'
import { userAddress } from './send.service.js'

/** How long a typing event (started or stopped) holds before it lapses. */
const TYPING_TTL_MS = 15_000

/**
 * The feeds a sender's typing may write, in this process: 1,000 a second (a 1,000-member group's
 * start or stop each second), 5,000 at once. Past that, 429 with the seconds until it refills.
 */
const TYPING_FEEDS_PER_SECOND = 1_000
const TYPING_FEEDS_BURST = 5_000

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
function sweep (live: Map<string, number>, now: number): void {
  for (const [key, expires] of live) if (expires <= now) live.delete(key)
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

export interface Typing {
  /** typing.started to the recipient (or each other member of a group), lapsing after 15 s. */
  start(from: string, to: string): Promise<void>
  /** typing.stopped, lapsing like a start: it only matters while a start could still be shown. */
  stop(from: string, to: string): Promise<void>
}

/**
 * Typing indicators, with what this process keeps of them. Group typing fans out to every
 * member, so it is coalesced per (sender, group): a typing.started is not sent again while the
 * previous one still has more than half its TTL to live, and a typing.stopped only follows a
 * live start. And what a sender's typing writes is bounded (TYPING_FEEDS_PER_SECOND): typing
 * counts against no quota, and a start and a stop in turn are each a fan-out. What is spent
 * inside the transaction stays spent if it rolls back (or runs again after a deadlock): a
 * typing call's worth, which errs on the side of the bound. `now` is the app's clock (ms),
 * which tests move.
 */
export function createTyping (db: Db, now: () => number): Typing {
  /** sender|group to the live start's expiry (ms since the epoch, database clock). */
  const liveGroupTyping = new Map<string, number>()
  const budget = new FeedWriteBudget(TYPING_FEEDS_PER_SECOND, TYPING_FEEDS_BURST, now)
  // The contract's one rate message (SPEC.md §7), with the wait in Retry-After.
  const spend = (from: string, feeds: number) => {
    const wait = feeds === 0 ? 0 : budget.take(from, feeds)
    if (wait > 0) throw new RateLimited(RATE_LIMIT_MESSAGE, wait)
  }
  /**
   * What a start and a stop both begin with, in their transaction: who the indicator goes to
   * (undefined: no one, the caller unknown to the user), its expiry, the coalescing key, the
   * database clock now, and whether it goes to a group. A user's one feed is spent whether it
   * knows the caller or not: a refusal must not tell.
   */
  const begin = async (tx: Db, from: string, to: string) => {
    const target = await resolveRecipients(tx, from, to)
    const group = isGroupId(target.recipient)
    if (!group) spend(from, 1)
    if (!await reaches(tx, from, target)) return undefined
    const expiresAt = await createEventsRepository(tx).expiryAfter(TYPING_TTL_MS)
    const at = expiresAt.getTime() - TYPING_TTL_MS
    if (group) sweep(liveGroupTyping, at)
    return { target, group, expiresAt, at, key: `${from}|${target.recipient}` }
  }
  // The map changes once the transaction has committed: run again after a deadlock, it finds
  // what it found the first time, and a rollback leaves no start it did not send.
  return {
    async start (from, to) {
      const started = await transaction(db, async (tx): Promise<{ key: string, expires: number } | undefined> => {
        const typing = await begin(tx, from, to)
        if (typing === undefined) return
        const { target, group, expiresAt, at, key } = typing
        if (group) {
          const live = liveGroupTyping.get(key)
          if (live !== undefined && live - at > TYPING_TTL_MS / 2) return
          spend(from, target.addresses.length)
        }
        const data = { from, to: target.recipient, expiresAt: expiresAt.toISOString() }
        await createEventsRepository(tx).append(target.addresses.map((address) => ({ address, type: 'typing.started', data, expiresAt })))
        return group ? { key, expires: expiresAt.getTime() } : undefined
      })
      if (started !== undefined) liveGroupTyping.set(started.key, started.expires)
    },
    async stop (from, to) {
      const stopped = await transaction(db, async (tx): Promise<string | undefined> => {
        const typing = await begin(tx, from, to)
        if (typing === undefined) return
        const { target, group, expiresAt, key } = typing
        if (group) {
          if (!liveGroupTyping.has(key)) return
          spend(from, target.addresses.length)
        }
        const data = { from, to: target.recipient }
        await createEventsRepository(tx).append(target.addresses.map((address) => ({ address, type: 'typing.stopped', data, expiresAt })))
        return group ? key : undefined
      })
      if (stopped !== undefined) liveGroupTyping.delete(stopped)
    }
  }
}
