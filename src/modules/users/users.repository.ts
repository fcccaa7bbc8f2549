import { and, asc, eq, gt, ilike, inArray, isNotNull, isNull, or, sql } from 'drizzle-orm'
import type { PgUpdateSetSource } from 'drizzle-orm/pg-core'
import type { Db } from '../../db/client.js'
import { Conflict } from '../../errors.js'
import { likePattern } from '../../db/like.js'
import { checkDisplayName } from './display-name.js'
import { queryRows } from '../../db/rows.js'
import type { AdminUser, ErasureState, User } from './users.schemas.js'
import { users, type UserRow } from './users.table.js'
import { normalizeAddress } from '../../ids.js'

export interface NewUser {
  address: string
  displayName?: string | null | undefined
  bot?: boolean
}

export function toUser (row: UserRow): User {
  return { address: row.address, displayName: row.displayName, bot: row.bot, createdAt: row.createdAt.toISOString() }
}

function erasureOf (row: UserRow): ErasureState | null {
  if (row.erasedAt !== null) return 'done'
  return row.erasureRequestedAt === null ? null : 'pending'
}

export function toAdminUser (row: UserRow): AdminUser {
  return { ...toUser(row), deactivatedAt: row.deactivatedAt?.toISOString() ?? null, erasure: erasureOf(row) }
}

/** The refusal of a change an erasure rules out: its address stays reserved, its data gone. */
export function erasedConflict (address: string, what: string): Conflict {
  return new Conflict(`user ${address} is erased (or being erased): ${what}; its address stays reserved`)
}

/** A user whose erasure is pending, and in how many milliseconds (by the database's clock) it may be marked done. */
export interface PendingErasure {
  address: string
  dueInMs: number
}

export function createUsersRepository (db: Db) {
  return {
    /**
     * Creates a user; an address already taken throws Conflict (saying so when an erasure keeps
     * it reserved), a display name with invisible characters ValidationFailed.
     */
    async create (user: NewUser): Promise<UserRow> {
      checkDisplayName(user.displayName)
      const address = normalizeAddress(user.address)
      const [row] = await db.insert(users).values({ address, displayName: user.displayName ?? null, bot: user.bot ?? false })
        .onConflictDoNothing({ target: users.address }).returning()
      if (row !== undefined) return row
      const [taken] = await db.select({ erasureRequestedAt: users.erasureRequestedAt }).from(users).where(eq(users.address, address))
      if (taken !== undefined && taken.erasureRequestedAt !== null) throw erasedConflict(address, 'its address cannot be taken again')
      throw new Conflict(`user ${address} already exists`)
    },

    /** Creates a user unless the address is taken (then leaves that user as it is). */
    async ensure (user: NewUser): Promise<void> {
      checkDisplayName(user.displayName)
      await db.insert(users).values({ address: normalizeAddress(user.address), displayName: user.displayName ?? null, bot: user.bot ?? false })
        .onConflictDoNothing()
    },

    /** Which of these addresses are users, in one query. */
    async existing (addresses: string[]): Promise<Set<string>> {
      if (addresses.length === 0) return new Set()
      const rows = await db.select({ address: users.address }).from(users).where(inArray(users.address, addresses))
      return new Set(rows.map((r) => r.address))
    },

    /** Which of these users have been erased, or are being (API.md §14): their addresses stay reserved, and no one may add them anywhere. */
    async erased (addresses: string[]): Promise<string[]> {
      if (addresses.length === 0) return []
      const rows = await db.select({ address: users.address }).from(users)
        .where(and(inArray(users.address, addresses), isNotNull(users.erasureRequestedAt)))
      return rows.map((r) => r.address)
    },

    /**
     * Whether `to` knows `from` well enough to be told it types (API.md §13): a 1:1 message
     * between them either way, a group they both belong to, or `from` in `to`'s roster. Not
     * `to` in `from`'s roster: anyone may add anyone to their own roster, so it would let a
     * stranger reach everyone. Each test is an indexed look-up, stopped at its first row.
     */
    async acquainted (from: string, to: string): Promise<boolean> {
      const [row] = await queryRows<{ known: boolean }>(db, sql`
        SELECT EXISTS (SELECT 1 FROM messages WHERE sender = ${from} AND recipient = ${to})
          OR EXISTS (SELECT 1 FROM messages WHERE sender = ${to} AND recipient = ${from})
          OR EXISTS (SELECT 1 FROM group_members a JOIN group_members b ON b.group_id = a.group_id AND b.address = ${to}
                     WHERE a.address = ${from})
          OR EXISTS (SELECT 1 FROM roster_entries WHERE owner = ${to} AND entity = ${from}) AS known`)
      return row?.known === true
    },

    /** The user; with `share`, its row locked until the transaction ends (an erasure's request waits, or is waited for). */
    async find (address: string, lock?: 'share'): Promise<UserRow | undefined> {
      const query = db.select().from(users).where(eq(users.address, normalizeAddress(address)))
      const [row] = lock === 'share' ? await query.for('share') : await query
      return row
    },

    async list (): Promise<UserRow[]> {
      return db.select().from(users).orderBy(asc(users.address))
    },

    /** Users whose address or display name contains `text`, by address, after `after`. */
    async search (text: string, after: string | undefined, limit: number): Promise<UserRow[]> {
      const pattern = likePattern(text)
      return db.select().from(users)
        .where(and(
          or(ilike(users.address, pattern), ilike(users.displayName, pattern)),
          after === undefined ? undefined : gt(users.address, after)
        ))
        .orderBy(asc(users.address))
        .limit(limit)
    },

    /** A page of users by address, after `after`, optionally those whose address or name contains `text`. */
    async page (text: string | undefined, after: string | undefined, limit: number): Promise<UserRow[]> {
      const pattern = text === undefined ? undefined : likePattern(text)
      return db.select().from(users)
        .where(and(
          pattern === undefined ? undefined : or(ilike(users.address, pattern), ilike(users.displayName, pattern)),
          after === undefined ? undefined : gt(users.address, after)
        ))
        .orderBy(asc(users.address))
        .limit(limit)
    },

    /**
     * Renames and/or (re)activates a user; undefined when there is no such user. A user whose
     * erasure was asked for is neither renamed nor reactivated (Conflict): decided in the
     * update's own statement, so an erasure committed first is always seen.
     */
    async update (address: string, changes: { displayName?: string | null, deactivated?: boolean }): Promise<UserRow | undefined> {
      checkDisplayName(changes.displayName)
      const set: PgUpdateSetSource<typeof users> = {}
      if (changes.displayName !== undefined) set.displayName = changes.displayName
      // Deactivating twice keeps the first time.
      if (changes.deactivated === true) set.deactivatedAt = sql`coalesce(${users.deactivatedAt}, now())`
      if (changes.deactivated === false) set.deactivatedAt = null
      const normalized = normalizeAddress(address)
      const where = eq(users.address, normalized)
      if (Object.keys(set).length === 0) return (await db.select().from(users).where(where))[0]
      // Deactivating an erased user again changes nothing and is allowed; anything else would bring some of it back.
      const harmless = changes.displayName === undefined && changes.deactivated !== false
      const [row] = await db.update(users).set(set)
        .where(harmless ? where : and(where, isNull(users.erasureRequestedAt))).returning()
      if (row !== undefined || harmless) return row
      const [erased] = await db.select({ address: users.address }).from(users).where(where)
      if (erased === undefined) return undefined
      throw erasedConflict(normalized, changes.deactivated === false ? 'it cannot be reactivated' : 'it cannot be renamed')
    },

    /**
     * Asks for the user's erasure (API.md §14): deactivated at once, its display name cleared,
     * and the request recorded for the erasure job. Asking again changes nothing (the first
     * times stay). Undefined when there is no such user.
     */
    async requestErasure (address: string): Promise<UserRow | undefined> {
      const [row] = await db.update(users).set({
        deactivatedAt: sql`coalesce(${users.deactivatedAt}, now())`,
        erasureRequestedAt: sql`coalesce(${users.erasureRequestedAt}, now())`,
        displayName: null
      }).where(eq(users.address, normalizeAddress(address))).returning()
      return row
    },

    /**
     * Users whose erasure is pending, oldest request first, each with how long until `graceMs`
     * has passed since its request (0 once it has): the erasure job's work list.
     */
    async pendingErasures (graceMs: number): Promise<PendingErasure[]> {
      const rows = await queryRows<{ address: string, due_in_ms: number }>(db, sql`
        SELECT address, greatest(0, ceil(extract(epoch FROM erasure_requested_at + make_interval(secs => ${graceMs / 1000}) - now()) * 1000))::float8 AS due_in_ms
        FROM users WHERE erasure_requested_at IS NOT NULL AND erased_at IS NULL
        ORDER BY erasure_requested_at, address`)
      return rows.map((r) => ({ address: r.address, dueInMs: Number(r.due_in_ms) }))
    },

    /**
     * Marks a pending erasure done, once `graceMs` has passed since it was asked for (by the
     * database's clock); false while it has not (or when it is not pending).
     */
    async markErased (address: string, graceMs: number): Promise<boolean> {
      const done = await db.update(users).set({ erasedAt: sql`now()`, displayName: null })
        .where(and(
          eq(users.address, address),
          isNull(users.erasedAt),
          sql`${users.erasureRequestedAt} <= now() - make_interval(secs => ${graceMs / 1000})`
        ))
        .returning({ address: users.address })
      return done.length > 0
    },

    /** Makes sure the bot user exists and is marked as a bot (TEST_BOT_ADDRESS may differ from the seed). */
    async ensureBot (address: string): Promise<void> {
      await db.insert(users).values({ address: normalizeAddress(address), displayName: 'Test bot', bot: true })
        .onConflictDoUpdate({ target: users.address, set: { bot: sql`true` } })
    }
  }
}
