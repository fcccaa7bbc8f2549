import { createHash, timingSafeEqual } from 'node:crypto'
import { and, eq, gt, inArray, lte, sql } from 'drizzle-orm'
import type { Db } from '../../db/client.js'
import { queryPrepared } from '../../db/rows.js'
import { keyring } from '../../sealing/keyring.js'
import { idempotencyKeys } from './idempotency.table.js'

/** How long an Idempotency-Key answers for its send. */
export const IDEMPOTENCY_WINDOW_MS = 24 * 60 * 60 * 1000

// Seed of the 64-bit hash that names an Idempotency-Key's advisory lock (any fixed value; the
// one used before coalescing, so instances of both versions exclude each other during an upgrade).
const LOCK_SEED = 0x1de

/**
 * What a record keeps of its request: a keyed tag (Keyring.tag) of the request's canonical
 * text, and the key that tagged it. A plain SHA-256 of the fields confirmed a guessed body to
 * whoever read the table (API.md §11); the tag confirms nothing without the key.
 */
export interface RequestTag { hash: string, sealedBy: string }

/** A record's request as stored: sealedBy NULL for one written before sealing (a plain SHA-256). */
export interface StoredRequest { requestHash: string, sealedBy: string | null }

/** The tag of `request` (a request's canonical text: what makes two requests the same) under the active key. */
export function requestTag (request: string): RequestTag {
  const ring = keyring()
  return { hash: ring.tag(request), sealedBy: ring.active }
}

/**
 * Whether `stored` was recorded for the same request as `request`: tagged again under the
 * record's own key, so a record from before a rotation still matches its retries (a record
 * under a key no longer configured answers SealedKeyMissing, 503). A record from before sealing
 * holds the plain SHA-256 and is compared as such; it is gone within the 24 h window.
 */
export function sameRequest (stored: StoredRequest, request: string): boolean {
  const hash = stored.sealedBy === null
    ? createHash('sha256').update(request).digest('hex')
    : keyring().tag(request, stored.sealedBy)
  return hash.length === stored.requestHash.length && timingSafeEqual(Buffer.from(hash), Buffer.from(stored.requestHash))
}

/** An Idempotency-Key as its lock and record know it: per API key. */
export interface HeldKey { keyId: string, idempotencyKey: string }

/**
 * Idempotency-Key records (written with their send, in the batch statement) and the locks that
 * keep two sends under one key from both going.
 */
export function createIdempotencyRepository (db: Db) {
  return {
    /**
     * Takes the locks of these keys without waiting (call it inside the transaction that then
     * writes their sends): true where the lock is now held, false where a send still in flight
     * holds it, null where there is no key. The write is a later statement, so its snapshot
     * sees every record committed before the lock was taken.
     */
    async tryLocks (keys: (HeldKey | undefined)[]): Promise<(boolean | null)[]> {
      const names = keys.map((k) => k === undefined ? null : `${k.keyId} ${k.idempotencyKey}`)
      const rows = await queryPrepared<{ held: boolean | null }>(db, sql`
        SELECT CASE WHEN k IS NULL THEN NULL ELSE pg_try_advisory_xact_lock(hashtextextended(k, ${LOCK_SEED}::bigint)) END AS held
        FROM unnest(${sql.param(names)}::text[]) WITH ORDINALITY AS t(k, ord) ORDER BY ord`)
      return rows.map((r) => r.held)
    },

    /**
     * Takes the lock of one key, waiting for a holder to finish (call it inside the transaction
     * that then reads the record and does the work): for an edit, which is one request's work.
     */
    async lock (key: HeldKey): Promise<void> {
      await db.execute(sql`SELECT pg_advisory_xact_lock(hashtextextended(${`${key.keyId} ${key.idempotencyKey}`}, ${LOCK_SEED}::bigint))`)
    },

    /** Records what a key did (under its lock, in the transaction that did it), replacing a record past the window. */
    async record (key: HeldKey, request: RequestTag, messageId: string): Promise<void> {
      const written = { requestHash: request.hash, sealedBy: request.sealedBy, messageId }
      await db.insert(idempotencyKeys).values({ keyId: key.keyId, idempotencyKey: key.idempotencyKey, ...written })
        .onConflictDoUpdate({
          target: [idempotencyKeys.keyId, idempotencyKeys.idempotencyKey],
          set: { ...written, createdAt: sql`now()` }
        })
    },

    /**
     * The live record of a key, read without its lock: for a send that found the lock taken.
     * Another retry's replay holds it as briefly as a send does, so a taken lock alone does not
     * mean a send is in flight; a record committed means the send it names has finished.
     */
    async find (key: HeldKey): Promise<(StoredRequest & { messageId: string }) | undefined> {
      // The window is the database's clock, as the batch statement's is.
      const [row] = await db.select({ messageId: idempotencyKeys.messageId, requestHash: idempotencyKeys.requestHash, sealedBy: idempotencyKeys.sealedBy })
        .from(idempotencyKeys)
        .where(and(eq(idempotencyKeys.keyId, key.keyId), eq(idempotencyKeys.idempotencyKey, key.idempotencyKey),
          gt(idempotencyKeys.createdAt, sql`now() - make_interval(secs => ${IDEMPOTENCY_WINDOW_MS / 1000})`)))
      return row
    },

    /** Erasure: every record of these keys (the messages they name are gone). */
    async forget (keyIds: string[]): Promise<void> {
      if (keyIds.length > 0) await db.delete(idempotencyKeys).where(inArray(idempotencyKeys.keyId, keyIds))
    },

    /** Retention: records past the window answer nothing any more. */
    async purge (): Promise<void> {
      await db.delete(idempotencyKeys).where(lte(idempotencyKeys.createdAt, sql`now() - make_interval(secs => ${IDEMPOTENCY_WINDOW_MS / 1000})`))
    }
  }
}
