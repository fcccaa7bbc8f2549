import { asc, eq } from 'drizzle-orm'
import type { Db } from '../../db/client.js'
import { NotFound } from '../../errors.js'
import { apiKeys, type ApiKeyRow } from './keys.table.js'
import { hashSecret, newKeyId, newSecret } from './secrets.js'

export interface CreatedKey {
  keyId: string
  /** In clear only here, to be shown once. */
  secret: string
}

export type ApiKey = Omit<ApiKeyRow, 'secretHash'>

const publicColumns = {
  id: apiKeys.id,
  address: apiKeys.address,
  dailyQuota: apiKeys.dailyQuota,
  createdAt: apiKeys.createdAt,
  revokedAt: apiKeys.revokedAt
}

export function createKeysRepository (db: Db) {
  return {
    /** Creates a key for an existing user; stores only the secret's SHA-256. */
    async create (address: string, dailyQuota: number | null = null): Promise<CreatedKey> {
      const keyId = newKeyId()
      const secret = newSecret()
      await db.insert(apiKeys).values({ id: keyId, address: address.toLowerCase(), secretHash: hashSecret(secret), dailyQuota })
      return { keyId, secret }
    },

    /** Keys, newest last, without their hashes; all of them, or one user's. */
    async list (address?: string): Promise<ApiKey[]> {
      const query = db.select(publicColumns).from(apiKeys)
      const filtered = address === undefined ? query : query.where(eq(apiKeys.address, address.toLowerCase()))
      return filtered.orderBy(asc(apiKeys.createdAt), asc(apiKeys.id))
    },

    /** What authentication needs: the hash, the owner, the quota and whether it is revoked. */
    async findForAuth (keyId: string): Promise<ApiKeyRow | undefined> {
      const [row] = await db.select().from(apiKeys).where(eq(apiKeys.id, keyId))
      return row
    },

    async count (): Promise<number> {
      return db.$count(apiKeys)
    },

    async revoke (keyId: string): Promise<ApiKey> {
      const [existing] = await db.select(publicColumns).from(apiKeys).where(eq(apiKeys.id, keyId))
      if (existing === undefined) throw new NotFound('key', keyId)
      if (existing.revokedAt !== null) return existing
      const [row] = await db.update(apiKeys).set({ revokedAt: new Date() }).where(eq(apiKeys.id, keyId)).returning(publicColumns)
      return row!
    },

    async setDailyQuota (keyId: string, dailyQuota: number | null): Promise<ApiKey> {
      const [row] = await db.update(apiKeys).set({ dailyQuota }).where(eq(apiKeys.id, keyId)).returning(publicColumns)
      if (row === undefined) throw new NotFound('key', keyId)
      return row
    }
  }
}

export type KeysRepository = ReturnType<typeof createKeysRepository>
