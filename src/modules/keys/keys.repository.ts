import { and, asc, eq, gt, isNull, or, sql, type Placeholder, type SQL } from 'drizzle-orm'
import type { TimeCursor } from '../../cursors.js'
import type { Db } from '../../db/client.js'
import { dateOf, dateOrNull, queryShaped, type DriverTime } from '../../db/rows.js'
import { transaction } from '../../db/transaction.js'
import { NotFound } from '../../errors.js'
import { users } from '../users/users.table.js'
import { webhooks } from '../webhooks/webhooks.table.js'
import type { Key } from './keys.schemas.js'
import { apiKeys, type ApiKeyRow } from './keys.table.js'
import { DEFAULT_SCOPES, SCOPES, type Scope } from '../../scopes.js'
import { hashSecret, newKeyId, newSecret } from './secrets.js'
import { normalizeAddress } from '../../ids.js'

export interface CreatedKey {
  keyId: string
  /** In clear only here, to be shown once. */
  secret: string
}

export type ApiKey = Omit<ApiKeyRow, 'secretHash'>

export function toKey (key: ApiKey): Key {
  return {
    keyId: key.id,
    address: key.address,
    scopes: key.scopes.filter((s): s is Key['scopes'][number] => (SCOPES as readonly string[]).includes(s)),
    dailyQuota: key.dailyQuota,
    expiresAt: key.expiresAt?.toISOString() ?? null,
    lastUsedAt: key.lastUsedAt?.toISOString() ?? null,
    createdAt: key.createdAt.toISOString(),
    revokedAt: key.revokedAt?.toISOString() ?? null
  }
}

/** A key as authentication sees it: with its hash, and whether its user is deactivated. */
export type KeyForAuth = ApiKeyRow & { userDeactivatedAt: Date | null }

/** findManyForAuth's row as the driver answers it (a time as text, or a Date: dateOf takes either). */
interface RawKeyForAuth {
  id: string
  address: string
  secret_hash: string
  daily_quota: number | null
  scopes: string[]
  created_at: DriverTime
  revoked_at: DriverTime | null
  expires_at: DriverTime | null
  last_used_at: DriverTime | null
  user_deactivated_at: DriverTime | null
}

const forAuth = (): SQL => sql`
  SELECT k.id, k.address, k.secret_hash, k.daily_quota, k.scopes, k.created_at, k.revoked_at, k.expires_at,
    k.last_used_at, u.deactivated_at AS user_deactivated_at
  FROM ${apiKeys} k JOIN ${users} u ON u.address = k.address
  WHERE k.id = ANY(${sql.placeholder('keyIds')}::text[])`

// Rows locked in id order, and skipped when another transaction holds one (an admin's change,
// an erasure, another instance's batch): the time is a hint, and a batch of 500 waiting on one
// row would hold the others' locks meanwhile, or deadlock with a writer that locks in another order.
const touched = (): SQL => sql`
  UPDATE ${apiKeys} SET last_used_at = now()
  WHERE id IN (SELECT id FROM ${apiKeys} WHERE id = ANY(${sql.placeholder('keyIds')}::text[]) ORDER BY id FOR UPDATE SKIP LOCKED)`

function keyForAuthOf (raw: RawKeyForAuth): KeyForAuth {
  return {
    id: raw.id,
    address: raw.address,
    secretHash: raw.secret_hash,
    dailyQuota: raw.daily_quota,
    scopes: raw.scopes,
    createdAt: dateOf(raw.created_at),
    revokedAt: dateOrNull(raw.revoked_at),
    expiresAt: dateOrNull(raw.expires_at),
    lastUsedAt: dateOrNull(raw.last_used_at),
    userDeactivatedAt: dateOrNull(raw.user_deactivated_at)
  }
}

export interface KeyOptions {
  dailyQuota?: number | null
  scopes?: Scope[]
  expiresAt?: Date | null
}

const publicColumns = {
  id: apiKeys.id,
  address: apiKeys.address,
  dailyQuota: apiKeys.dailyQuota,
  scopes: apiKeys.scopes,
  createdAt: apiKeys.createdAt,
  revokedAt: apiKeys.revokedAt,
  expiresAt: apiKeys.expiresAt,
  lastUsedAt: apiKeys.lastUsedAt
}

/** Over api_keys joined to users: the key authenticates now and has `scope`. */
function acceptedWith (scope: 'read' | 'admin'): SQL | undefined {
  return and(
    isNull(apiKeys.revokedAt),
    or(isNull(apiKeys.expiresAt), gt(apiKeys.expiresAt, sql`now()`)),
    isNull(users.deactivatedAt),
    sql`${scope} = ANY(${apiKeys.scopes})`
  )
}

const acceptedForReading = acceptedWith('read')

/**
 * A condition true while key `keyId` may read `address`'s feed (readable() for one key, and the
 * feed its user's), for a read of the feed to carry: in the same statement, so a snapshot that
 * sees an event committed after a revocation sees the revocation too.
 */
export function keyMayRead (keyId: string | Placeholder | SQL, address: string | Placeholder | SQL): SQL {
  return sql`EXISTS (SELECT 1 FROM ${apiKeys} INNER JOIN ${users} ON ${users.address} = ${apiKeys.address}
    WHERE ${apiKeys.id} = ${keyId} AND ${apiKeys.address} = ${address} AND ${acceptedForReading})`
}

export function createKeysRepository (db: Db) {
  return {
    /** Creates a key for an existing user; stores only the secret's SHA-256. */
    async create (address: string, dailyQuota: number | null = null, options: Omit<KeyOptions, 'dailyQuota'> = {}): Promise<CreatedKey & { key: ApiKey }> {
      const keyId = newKeyId()
      const secret = newSecret()
      const [key] = await db.insert(apiKeys).values({
        id: keyId,
        address: normalizeAddress(address),
        secretHash: hashSecret(secret),
        dailyQuota,
        scopes: [...new Set(options.scopes ?? DEFAULT_SCOPES)],
        expiresAt: options.expiresAt ?? null
      }).returning(publicColumns)
      return { keyId, secret, key: key! }
    },

    async find (keyId: string): Promise<ApiKey | undefined> {
      const [row] = await db.select(publicColumns).from(apiKeys).where(eq(apiKeys.id, keyId))
      return row
    },

    /** Changes a key's scopes, quota override or expiry (what is given); NotFound if there is no such key. */
    async update (keyId: string, changes: KeyOptions): Promise<ApiKey> {
      const set: Partial<typeof apiKeys.$inferInsert> = {}
      if (changes.scopes !== undefined) set.scopes = [...new Set(changes.scopes)]
      if (changes.dailyQuota !== undefined) set.dailyQuota = changes.dailyQuota
      if (changes.expiresAt !== undefined) set.expiresAt = changes.expiresAt
      const [row] = Object.keys(set).length === 0
        ? await db.select(publicColumns).from(apiKeys).where(eq(apiKeys.id, keyId))
        : await db.update(apiKeys).set(set).where(eq(apiKeys.id, keyId)).returning(publicColumns)
      if (row === undefined) throw new NotFound('key', keyId)
      return row
    },

    /** Records that these keys were used now (lastUsedAt), in one prepared statement (callers rate-limit this: it is a write). */
    async touch (keyIds: string[]): Promise<void> {
      await queryShaped(db, 'keys.touch', touched, { keyIds })
    },

    /** Keys, newest last, without their hashes; all of them, or one user's. */
    async list (address?: string): Promise<ApiKey[]> {
      const query = db.select(publicColumns).from(apiKeys)
      const filtered = address === undefined ? query : query.where(eq(apiKeys.address, normalizeAddress(address)))
      return filtered.orderBy(asc(apiKeys.createdAt), asc(apiKeys.id))
    },

    /** Up to `limit` keys in list()'s order, after the key `after` names (keyset: its creation time and id). */
    async page (address: string | undefined, after: TimeCursor | undefined, limit: number): Promise<ApiKey[]> {
      return db.select(publicColumns).from(apiKeys)
        .where(and(address === undefined ? undefined : eq(apiKeys.address, normalizeAddress(address)),
          after === undefined ? undefined : sql`(${apiKeys.createdAt}, ${apiKeys.id}) > (${after.at}::timestamptz, ${after.id})`))
        .orderBy(asc(apiKeys.createdAt), asc(apiKeys.id))
        .limit(limit)
    },

    /**
     * What authentication needs of each of these keys, by id (an id with no key is missing): the
     * hash, the owner and its state, the quota, scopes, revocation and expiry. One statement for
     * many ids: the authenticator gathers its look-ups. Built once and prepared (queryShaped): every key
     * looks itself up again each KEY_CACHE_MS, so with thousands of keys connected this runs
     * hundreds of times a second, and building it with the query builder each time was a tenth
     * of a 1,000-connection server's busy time (bench:connections).
     */
    async findManyForAuth (keyIds: string[]): Promise<Map<string, KeyForAuth>> {
      const rows = await queryShaped<RawKeyForAuth>(db, 'keys.for-auth', forAuth, { keyIds })
      return new Map(rows.map((row) => [row.id, keyForAuthOf(row)]))
    },

    /**
     * Which of these keys would still authenticate now with `scope` (read: may read a feed):
     * not revoked, not expired (by the database's clock), their user not deactivated, with the
     * scope. A key that no longer exists is missing too. The key watch asks this every second
     * for every key holding a stream or a long-poll: one array parameter and a statement built
     * once a scope, where an IN list built anew for 3,000 keys was 3 % of a 5,000-connection
     * server's busy time.
     */
    async accepted (keyIds: string[], scope: 'read' | 'admin' = 'read'): Promise<Set<string>> {
      if (keyIds.length === 0) return new Set()
      const rows = await queryShaped<{ id: string }>(db, `keys.accepted.${scope}`, () => sql`
        SELECT ${apiKeys.id} AS id FROM ${apiKeys} INNER JOIN ${users} ON ${users.address} = ${apiKeys.address}
        WHERE ${apiKeys.id} = ANY(${sql.placeholder('keyIds')}::text[]) AND ${acceptedWith(scope)}`, { keyIds })
      return new Set(rows.map((r) => r.id))
    },

    async count (): Promise<number> {
      return db.$count(apiKeys)
    },

    /**
     * Revokes a key and, in the same transaction, disables the webhooks it registered (for good:
     * a revoked key never comes back; its user registers them again with another key).
     */
    async revoke (keyId: string): Promise<ApiKey> {
      return transaction(db, async (tx) => {
        const [existing] = await tx.select(publicColumns).from(apiKeys).where(eq(apiKeys.id, keyId))
        if (existing === undefined) throw new NotFound('key', keyId)
        if (existing.revokedAt !== null) return existing
        const [row] = await tx.update(apiKeys).set({ revokedAt: sql`now()` }).where(eq(apiKeys.id, keyId)).returning(publicColumns)
        await tx.update(webhooks).set({ disabledAt: sql`now()` }).where(and(eq(webhooks.keyId, keyId), isNull(webhooks.disabledAt)))
        return row!
      })
    },

    /**
     * Erasure: deletes every key of the user, with what goes with a key by cascade (its feed
     * acknowledgements, the webhooks it registered); answers their ids.
     */
    async removeAllOf (address: string): Promise<string[]> {
      const gone = await db.delete(apiKeys).where(eq(apiKeys.address, address)).returning({ id: apiKeys.id })
      return gone.map((r) => r.id)
    },

    async setDailyQuota (keyId: string, dailyQuota: number | null): Promise<ApiKey> {
      const [row] = await db.update(apiKeys).set({ dailyQuota }).where(eq(apiKeys.id, keyId)).returning(publicColumns)
      if (row === undefined) throw new NotFound('key', keyId)
      return row
    }
  }
}
