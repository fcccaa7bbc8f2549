import { and, asc, count, eq, ilike, inArray, isNull, ne, sql } from 'drizzle-orm'
import type { Db } from '../../db/client.js'
import { likePattern } from '../../db/like.js'
import { queryRows } from '../../db/rows.js'
import { newId } from '../../ids.js'
import { users } from '../users/users.table.js'
import type { StoredGroup } from './groups.schemas.js'
import { groupMembers, groups, type GroupRow } from './groups.table.js'

export function toGroup (row: GroupRow, members: string[]): StoredGroup {
  return {
    id: row.id,
    name: row.name,
    owner: row.owner,
    members,
    retentionDays: row.retentionDays,
    createdAt: row.createdAt.toISOString(),
    updatedAt: row.updatedAt.toISOString()
  }
}

/** The first key of a group's advisory lock (the second is a hash of its id). */
export const GROUP_LOCK_CLASS = 0x67727020

export function createGroupsRepository (db: Db) {
  return {
    async create (name: string, owner: string, members: string[]): Promise<StoredGroup> {
      const [row] = await db.insert(groups).values({ id: newId('grp'), name, owner }).returning()
      const all = [...new Set([owner, ...members])].sort()
      await db.insert(groupMembers).values(all.map((address) => ({ groupId: row!.id, address })))
      return toGroup(row!, all)
    },

    /**
     * The group row; `lock` holds the group shared (a send, which must not race a membership
     * change) or exclusive (a change), until the caller's transaction ends.
     *
     * Row locks alone starve a change: share lockers join the lock held by other share lockers
     * without queueing, so steady sends to a busy group keep a membership change waiting for
     * ever. An advisory lock on the group id comes first: PostgreSQL queues those fairly, so a
     * waiting change holds back sends that arrive after it.
     */
    async find (id: string, lock?: 'share' | 'update'): Promise<GroupRow | undefined> {
      const query = db.select().from(groups).where(eq(groups.id, id))
      if (lock === undefined) return (await query)[0]
      await db.execute(lock === 'share'
        ? sql`SELECT pg_advisory_xact_lock_shared(${GROUP_LOCK_CLASS}, hashtext(${id}))`
        : sql`SELECT pg_advisory_xact_lock(${GROUP_LOCK_CLASS}, hashtext(${id}))`)
      const [row] = await query.for(lock === 'share' ? 'share' : 'no key update')
      return row
    },

    async members (id: string): Promise<string[]> {
      const rows = await db.select({ address: groupMembers.address }).from(groupMembers)
        .where(eq(groupMembers.groupId, id)).orderBy(asc(groupMembers.address))
      return rows.map((r) => r.address)
    },

    /** How many members a message reaches (activeMembers), counted by the index alone. */
    async activeMemberCount (id: string): Promise<number> {
      const [row] = await db.select({ n: count() }).from(groupMembers)
        .innerJoin(users, eq(users.address, groupMembers.address))
        .where(and(eq(groupMembers.groupId, id), isNull(users.deactivatedAt)))
      return row?.n ?? 0
    },

    /** Members a message reaches: those whose user an operator has not deactivated. */
    async activeMembers (id: string): Promise<string[]> {
      const rows = await db.select({ address: groupMembers.address }).from(groupMembers)
        .innerJoin(users, eq(users.address, groupMembers.address))
        .where(and(eq(groupMembers.groupId, id), isNull(users.deactivatedAt))).orderBy(asc(groupMembers.address))
      return rows.map((r) => r.address)
    },

    /** When `address` joined group `id` (its latest joining), or undefined when it is not a member. */
    async joinedAt (id: string, address: string): Promise<Date | undefined> {
      const [row] = await db.select({ addedAt: groupMembers.addedAt }).from(groupMembers)
        .where(and(eq(groupMembers.groupId, id), eq(groupMembers.address, address)))
      return row?.addedAt
    },

    async isMember (id: string, address: string): Promise<boolean> {
      const [row] = await db.select({ address: groupMembers.address }).from(groupMembers)
        .where(and(eq(groupMembers.groupId, id), eq(groupMembers.address, address)))
      return row !== undefined
    },

    async view (row: GroupRow): Promise<StoredGroup> {
      return toGroup(row, await this.members(row.id))
    },

    /** Renames the group and/or sets its retention (null clears it): what `changes` gives. */
    async update (id: string, changes: { name?: string | undefined, retentionDays?: number | null | undefined }): Promise<GroupRow> {
      const [row] = await db.update(groups).set({
        ...(changes.name === undefined ? {} : { name: changes.name }),
        ...(changes.retentionDays === undefined ? {} : { retentionDays: changes.retentionDays }),
        updatedAt: sql`now()`
      }).where(eq(groups.id, id)).returning()
      return row!
    },

    async remove (id: string): Promise<void> {
      await db.delete(groups).where(eq(groups.id, id))
    },

    /** Adds addresses; returns those that were not members before. */
    async addMembers (id: string, addresses: string[]): Promise<string[]> {
      if (addresses.length === 0) return []
      const added = await db.insert(groupMembers).values(addresses.map((address) => ({ groupId: id, address })))
        .onConflictDoNothing().returning({ address: groupMembers.address })
      if (added.length > 0) await db.update(groups).set({ updatedAt: sql`now()` }).where(eq(groups.id, id))
      return added.map((a) => a.address).sort()
    },

    async removeMembers (id: string, addresses: string[]): Promise<void> {
      if (addresses.length === 0) return
      await db.delete(groupMembers).where(and(eq(groupMembers.groupId, id), inArray(groupMembers.address, addresses)))
      await db.update(groups).set({ updatedAt: sql`now()` }).where(eq(groups.id, id))
    },

    /** Erasure: up to `limit` groups `address` belongs to or owns, by id. */
    async ofMemberOrOwner (address: string, limit: number): Promise<string[]> {
      const rows = await queryRows<{ id: string }>(db, sql`
        SELECT group_id AS id FROM ${groupMembers} WHERE address = ${address}
        UNION SELECT id FROM ${groups} WHERE owner = ${address}
        ORDER BY id LIMIT ${limit}`)
      return rows.map((r) => r.id)
    },

    /** The member that joined longest ago, `except` aside (ties by address); undefined when there is none. */
    async longestStanding (id: string, except: string): Promise<string | undefined> {
      // An active member first (not deactivated, not being erased): a group handed to a user
      // nobody can act as would have no one to manage it; failing that, still the longest-standing.
      const [row] = await db.select({ address: groupMembers.address }).from(groupMembers)
        .innerJoin(users, eq(users.address, groupMembers.address))
        .where(and(eq(groupMembers.groupId, id), ne(groupMembers.address, except)))
        .orderBy(sql`(${users.deactivatedAt} IS NULL AND ${users.erasureRequestedAt} IS NULL) DESC`, asc(groupMembers.addedAt), asc(groupMembers.address))
        .limit(1)
      return row?.address
    },

    async setOwner (id: string, owner: string): Promise<GroupRow> {
      const [row] = await db.update(groups).set({ owner, updatedAt: sql`now()` }).where(eq(groups.id, id)).returning()
      return row!
    },

    /** The caller's groups whose name contains `text`, by name. */
    async searchMine (address: string, text: string, after: { name: string, id: string } | undefined, limit: number): Promise<GroupRow[]> {
      const rows = await db.select({ group: groups }).from(groups)
        .innerJoin(groupMembers, and(eq(groupMembers.groupId, groups.id), eq(groupMembers.address, address)))
        .where(and(
          ilike(groups.name, likePattern(text)),
          after === undefined ? undefined : sql`(${groups.name}, ${groups.id}) > (${after.name}, ${after.id})`
        ))
        .orderBy(asc(groups.name), asc(groups.id))
        .limit(limit)
      return rows.map((r) => r.group)
    }
  }
}

export type GroupsRepository = ReturnType<typeof createGroupsRepository>
