import { and, inArray, isNull, lte, sql } from 'drizzle-orm'
import type { Db } from '../../db/client.js'
import { copyOutBinary, literal } from '../../db/copy-out.js'
import { keyring } from '../../sealing/keyring.js'
import { piecesLength } from '../../sealing/pieces.js'
import { record } from '../../sealing/records.js'
import { attachmentChunks } from './messages.table.js'

/**
 * Bytes per stored chunk, of the file itself (its plaintext). 256 KiB keeps each insert and each
 * download query short (a few ms), so on PGlite's one connection other requests interleave, and
 * memory per upload stays small. The last chunk of a file is shorter; every other is exactly
 * this long, so a byte offset maps to a chunk by division. The 0004 migration splits existing
 * files with the same figure. A sealed chunk's row holds SEAL_OVERHEAD bytes more: positions are
 * always computed from the file's own sizes, never from what the row holds.
 */
export const CHUNK_BYTES = 256 * 1024

/** What sealing adds to a chunk: its nonce (12 bytes) and its tag (16). */
const SEAL_OVERHEAD = 28

/** Unclaimed chunks older than this belong to no live upload (a crash mid-upload): swept. */
const STAGED_TTL_MS = 60 * 60 * 1000

/**
 * Staged and stored attachment bytes, sealed at rest (API.md §11): each chunk is sealed whole,
 * bound to its upload and place in the file (record.attachmentChunk), so a row's bytes moved to
 * another row or another place do not open. Every call is one short autocommit statement: the
 * connection is taken and released per chunk, never held while a client is still sending.
 * Buffers travel to `pg` as binary parameters (node-postgres sends a Buffer in binary format).
 */
export function createAttachmentChunksRepository (db: Db) {
  return {
    /** Seals a chunk of an upload under the active key and stages it. */
    async stage (uploadId: string, seq: number, data: Buffer): Promise<void> {
      const ring = keyring()
      await db.insert(attachmentChunks).values({ uploadId, seq, data: ring.seal(data, record.attachmentChunk(uploadId, seq)), sealedBy: ring.active })
    },

    /** Deletes what the uploads staged unless a send claimed it. */
    async discard (uploadIds: string[]): Promise<number> {
      if (uploadIds.length === 0) return 0
      const gone = await db.delete(attachmentChunks)
        .where(and(inArray(attachmentChunks.uploadId, uploadIds), isNull(attachmentChunks.messageId)))
        .returning({ seq: attachmentChunks.seq })
      return gone.length
    },

    /**
     * Chunk `seq` of a stored file, opened (a row written before sealing, sealed_by NULL, as it
     * is), in pieces of at most 64 KiB; undefined when there is no such row. One binary COPY
     * (db/copy-out.ts): the bytes as stored, no hex string, handed over in pieces,
     * however the file is read (downloads, Ranges, exports).
     * SealedKeyMissing (503) when its key is no longer configured.
     */
    async readChunk (uploadId: string, seq: number): Promise<Buffer[] | undefined> {
      const [row] = await copyOutBinary(db, sql`
        SELECT sealed_by, data FROM ${attachmentChunks} WHERE upload_id = ${literal(uploadId)} AND seq = ${sql.raw(String(Math.trunc(seq)))}`)
      // Gone (or deleted with its message before this read).
      if (row === undefined) return undefined
      const [keyId, data] = row
      if (data === null || data === undefined) throw new Error(`attachment ${uploadId} chunk ${seq} has no bytes`)
      // A row longer than any chunk can be was written by something else than this repository.
      const stored = piecesLength(data)
      if (stored > CHUNK_BYTES + SEAL_OVERHEAD) throw new Error(`attachment ${uploadId} chunk ${seq} holds ${stored} bytes, more than a chunk`)
      return keyId === null || keyId === undefined ? data : keyring().openPieces(data, record.attachmentChunk(uploadId, seq), Buffer.concat(keyId).toString('utf8'))
    },

    /** Unclaimed chunks staged before `olderThanMs` ago: uploads a crash cut off. */
    async sweep (olderThanMs = STAGED_TTL_MS): Promise<number> {
      const gone = await db.delete(attachmentChunks)
        .where(and(isNull(attachmentChunks.messageId), lte(attachmentChunks.stagedAt, sql`now() - make_interval(secs => ${olderThanMs / 1000})`)))
        .returning({ seq: attachmentChunks.seq })
      return gone.length
    }
  }
}

export type AttachmentChunksRepository = ReturnType<typeof createAttachmentChunksRepository>
