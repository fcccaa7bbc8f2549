import type { Db } from '../../db/client.js'
import { transaction } from '../../db/transaction.js'
import { Conflict, Forbidden, NotFound, ValidationFailed } from '../../errors.js'
import { createEventsRepository, type EventOf } from '../events/events.repository.js'
import { createMetadataRepository } from '../metadata/metadata.repository.js'
import { createUsersRepository } from '../users/users.repository.js'
import { createGroupsRepository, type GroupsRepository } from './groups.repository.js'
import type { Group, GroupSummary, StoredGroup } from './groups.schemas.js'
import type { GroupRow } from './groups.table.js'
import { normalizeAddress } from '../../ids.js'

/** A group the caller belongs to; unknown 404, not a member 403. */
export async function memberGroup (groups: GroupsRepository, id: string, address: string, lock?: 'share' | 'update'): Promise<GroupRow> {
  const row = await groups.find(id, lock)
  if (row === undefined) throw new NotFound('group', id)
  if (!await groups.isMember(id, address)) throw new Forbidden(`group ${id} is visible to its members only`)
  return row
}

async function ownedGroup (groups: GroupsRepository, id: string, address: string): Promise<GroupRow> {
  const row = await memberGroup(groups, id, address, 'update')
  if (row.owner !== address) throw new Forbidden(`only the owner of group ${id} may change it`)
  return row
}

/**
 * Every address must be a user: 404 naming the first that is not; 409 for one erased. One query for the lot: a
 * query per member held a connection for ~1 s per 1,000-member request and drained the pool.
 */
async function requireUsers (db: Db, addresses: string[]): Promise<string[]> {
  const unique = [...new Set(addresses.map(normalizeAddress))]
  const known = await createUsersRepository(db).existing(unique)
  const unknown = unique.find((address) => !known.has(address))
  if (unknown !== undefined) throw new NotFound('user', unknown)
  const [erased] = await createUsersRepository(db).erased(unique)
  if (erased !== undefined) throw new Conflict(`user ${erased} has been erased; its address is reserved and cannot join a group`)
  return unique
}

/** A group of `count` members (owner included) must fit MAX_GROUP_MEMBERS: it bounds fan-out. */
function requireRoom (count: number, maxMembers: number): void {
  if (count > maxMembers) {
    throw new ValidationFailed(`members: a group has at most ${maxMembers} members, the owner included; this would make ${count}`)
  }
}

/** The retention that applies to a group's messages: the shorter of its own and the service's (null, undefined: none). */
function effectiveRetention (own: number | null, service: number | undefined): number | null {
  if (own === null) return service ?? null
  return service === undefined ? own : Math.min(own, service)
}

/** A stored group as the API answers it, under the service's MESSAGE_RETENTION_DAYS (`service`). */
export function withRetention (group: StoredGroup, service: number | undefined): Group {
  return { ...group, effectiveRetentionDays: effectiveRetention(group.retentionDays, service) }
}

/** The group as group.created and group.updated carry it: no member list (API.md §13). */
function summary (group: StoredGroup): GroupSummary {
  return { id: group.id, name: group.name, owner: group.owner, memberCount: group.members.length, createdAt: group.createdAt }
}

async function tell (db: Db, addresses: string[], event: EventOf): Promise<void> {
  await createEventsRepository(db).append(addresses.map((address) => ({ address, ...event })))
}

/*
 * Group changes: each in one transaction with the events it causes, sent to every member
 * (removed members included). A change locks the group row, so it never interleaves with a
 * group send (which holds the row FOR SHARE).
 */

/** A new group; the owner is a member. Every member gets group.created. */
export async function createGroup (db: Db, maxMembers: number, owner: string, name: string, members: string[]): Promise<StoredGroup> {
  const unique = new Set([owner, ...members.map(normalizeAddress)])
  requireRoom(unique.size, maxMembers)
  return transaction(db, async (tx) => {
    const group = await createGroupsRepository(tx).create(name, owner, await requireUsers(tx, members))
    await tell(tx, group.members, { type: 'group.created', data: { group: summary(group) } })
    return group
  })
}

/** A group, for its members. */
export async function readGroup (db: Db, id: string, address: string): Promise<StoredGroup> {
  const groups = createGroupsRepository(db)
  return groups.view(await memberGroup(groups, id, address))
}

/** What POST /group/{id} may change: each field given is set (retentionDays null clears it). */
interface GroupChanges {
  name?: string | undefined
  retentionDays?: number | null | undefined
}

/**
 * The owner renames the group, or sets how long its messages are kept; every member gets
 * group.updated (whose messages the next purge may take).
 */
export async function updateGroup (db: Db, id: string, address: string, changes: GroupChanges): Promise<StoredGroup> {
  if (changes.name === undefined && changes.retentionDays === undefined) {
    throw new ValidationFailed('body: give name, retentionDays or both')
  }
  return transaction(db, async (tx) => {
    const groups = createGroupsRepository(tx)
    await ownedGroup(groups, id, address)
    const group = await groups.view(await groups.update(id, changes))
    await tell(tx, group.members, { type: 'group.updated', data: { group: summary(group) } })
    return group
  })
}

/** The owner deletes the group and its metadata; every member gets group.deleted. */
export async function deleteGroup (db: Db, id: string, address: string): Promise<void> {
  await transaction(db, async (tx) => {
    const groups = createGroupsRepository(tx)
    await ownedGroup(groups, id, address)
    const members = await groups.members(id)
    await groups.remove(id)
    // Its metadata goes with it (#14.7).
    await createMetadataRepository(tx).remove(id)
    await tell(tx, members, { type: 'group.deleted', data: { group: id } })
  })
}

/** The owner adds users; when any is new, every member gets group.members_added with those. */
export async function addGroupMembers (db: Db, maxMembers: number, id: string, address: string, addresses: string[]): Promise<StoredGroup> {
  return transaction(db, async (tx) => {
    const groups = createGroupsRepository(tx)
    await ownedGroup(groups, id, address)
    const wanted = await requireUsers(tx, addresses)
    // Counted under the group's exclusive lock, so two racing adds cannot both fit.
    const before = await groups.members(id)
    requireRoom(new Set([...before, ...wanted]).size, maxMembers)
    const added = await groups.addMembers(id, wanted)
    const group = await groups.view((await groups.find(id))!)
    if (added.length > 0) await tell(tx, group.members, { type: 'group.members_added', data: { group: id, members: added } })
    return group
  })
}

/** The owner removes anyone but itself; a member removes only itself (leaving). */
export async function removeGroupMembers (db: Db, id: string, address: string, addresses: string[]): Promise<StoredGroup> {
  return transaction(db, async (tx) => {
    const groups = createGroupsRepository(tx)
    const row = await memberGroup(groups, id, address, 'update')
    const leaving = [...new Set(addresses.map(normalizeAddress))]
    if (row.owner === address && leaving.includes(address)) {
      throw new ValidationFailed(`members: the owner cannot leave group ${id}; delete the group instead`)
    }
    if (row.owner !== address && leaving.some((a) => a !== address)) {
      throw new Forbidden(`only the owner of group ${id} may remove other members`)
    }
    const before = await groups.members(id)
    const absent = leaving.find((a) => !before.includes(a))
    if (absent !== undefined) throw new NotFound('member', `${absent} of group ${id}`)
    await groups.removeMembers(id, leaving)
    await tell(tx, before, { type: 'group.members_removed', data: { group: id, members: leaving.sort() } })
    return groups.view((await groups.find(id))!)
  })
}

/**
 * Erasure: `address` leaves group `id` as a member leaving would (group.members_removed to every
 * member, itself included). A group it owns passes to the member that joined longest ago
 * (group.updated to the members left), or is deleted, with its metadata, when no one is left
 * (group.deleted). The group's name, retention and metadata pass with it: they are the group's.
 * Locks the group as any change does; call it in the caller's transaction. Answers how many
 * events it wrote, for the caller's bound.
 */
export async function removeErasedMember (tx: Db, id: string, address: string): Promise<number> {
  const groups = createGroupsRepository(tx)
  const row = await groups.find(id, 'update')
  if (row === undefined) return 0
  const before = await groups.members(id)
  if (row.owner === address) {
    const heir = await groups.longestStanding(id, address)
    if (heir === undefined) {
      await groups.remove(id)
      await createMetadataRepository(tx).remove(id)
      await tell(tx, before, { type: 'group.deleted', data: { group: id } })
      return before.length
    }
    await groups.removeMembers(id, [address])
    await groups.setOwner(id, heir)
    const group = await groups.view((await groups.find(id))!)
    await tell(tx, before, { type: 'group.members_removed', data: { group: id, members: [address] } })
    await tell(tx, group.members, { type: 'group.updated', data: { group: summary(group) } })
    return before.length + group.members.length
  }
  if (!before.includes(address)) return 0
  await groups.removeMembers(id, [address])
  await tell(tx, before, { type: 'group.members_removed', data: { group: id, members: [address] } })
  return before.length
}
