import { and, asc, eq, gt, ilike, inArray, or, sql } from 'drizzle-orm'
import type { PgUpdateSetSource } from 'drizzle-orm/pg-core'
import type { Db } from '../../db/client.js'
import { sqlState, UNIQUE_VIOLATION } from '../../db/errors.js'
import { Conflict } from '../../errors.js'
import { likePattern } from '../../db/like.js'
import { checkDisplayName } from './display-name.js'
import { queryRows } from '../../db/rows.js'
import type { AdminUser, User } from './users.schemas.js'
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

export function toAdminUser (row: UserRow): AdminUser {
  return { ...toUser(row), deactivatedAt: row.deactivatedAt?.toISOString() ?? null }
}

export function createUsersRepository (db: Db) {
  return {
    /** Creates a user; an address already taken throws Conflict, a display name with invisible characters ValidationFailed. */
    async create (user: NewUser): Promise<UserRow> {
      checkDisplayName(user.displayName)
      try {
        const [row] = await db.insert(users).values({
          address: normalizeAddress(user.address),
          displayName: user.displayName ?? null,
          bot: user.bot ?? false
        }).returning()
        return row!
      } catch (err) {
        if (sqlState(err) === UNIQUE_VIOLATION) throw new Conflict(`user ${normalizeAddress(user.address)} already exists`)
        throw err
      }
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

    async find (address: string): Promise<UserRow | undefined> {
      const [row] = await db.select().from(users).where(eq(users.address, normalizeAddress(address)))
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

    /** Renames and/or (re)activates a user; undefined when there is no such user. */
    async update (address: string, changes: { displayName?: string | null, deactivated?: boolean }): Promise<UserRow | undefined> {
      checkDisplayName(changes.displayName)
      const set: PgUpdateSetSource<typeof users> = {}
      if (changes.displayName !== undefined) set.displayName = changes.displayName
      // Deactivating twice keeps the first time.
      if (changes.deactivated === true) set.deactivatedAt = sql`coalesce(${users.deactivatedAt}, now())`
      if (changes.deactivated === false) set.deactivatedAt = null
      const where = eq(users.address, normalizeAddress(address))
      const [row] = Object.keys(set).length === 0
        ? await db.select().from(users).where(where)
        : await db.update(users).set(set).where(where).returning()
      return row
    },

    /** Makes sure the bot user exists and is marked as a bot (TEST_BOT_ADDRESS may differ from the seed). */
    async ensureBot (address: string): Promise<void> {
      await db.insert(users).values({ address: normalizeAddress(address), displayName: 'Test bot', bot: true })
        .onConflictDoUpdate({ target: users.address, set: { bot: sql`true` } })
    }
  }
}
