import { and, inArray, isNull, lte, sql } from 'drizzle-orm'
import type { Db } from '../../db/client.js'
import { copyOutBinary, literal, pgClientOf } from '../../db/copy-out.js'
import { queryRows } from '../../db/rows.js'
import { keyring } from '../../sealing/keyring.js'
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

/**
 * Bytes of a stored chunk read per statement on PGlite, which answers bytea as hex text: a
 * string over 128 KiB lives in V8's large-object space until a full collection (1 MiB a query
 * grew a server by 150 MB over a 1 GiB export, when node-postgres read chunks this way too);
 * 60 KiB slices make strings the young generation frees at once. A chunk is read whole (a
 * sealed one opens only whole) as several such slices, one statement each: five slices as five
 * columns of one statement kept 600 KiB of strings alive at once and grew an exporting server by
 * 131 MiB on Node 24 (68 this way). On PostgreSQL a chunk is one binary COPY (db/copy-out.ts).
 */
const SLICE_BYTES = 60 * 1024

/** Unclaimed chunks older than this belong to no live upload (a crash mid-upload): swept. */
const STAGED_TTL_MS = 60 * 60 * 1000

/** bytea as either driver answers it: a Buffer or hex text (node-postgres), a Uint8Array (PGlite). */
function bytesOf (data: Buffer | Uint8Array | string): Buffer {
  if (Buffer.isBuffer(data)) return data
  if (typeof data === 'string') return Buffer.from(data.startsWith('\\x') ? data.slice(2) : data, 'hex')
  // Wrapped, not copied.
  return Buffer.from(data.buffer, data.byteOffset, data.byteLength)
}

/** A slice of one stored chunk's row, with its length as stored and its key. */
interface ChunkSlice {
  sealed_by: string | null
  stored: number | string
  slice: Buffer | Uint8Array | string
}

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
     * is), in pieces of about SLICE_BYTES; undefined when there is no such row (or it went
     * mid-read). A statement a slice, so no string the driver makes is a large object and no
     * buffer is a chunk's size, however the file is read (downloads, Ranges, exports).
     * SealedKeyMissing (503) when its key is no longer configured.
     */
    async readChunk (uploadId: string, seq: number): Promise<Buffer[] | undefined> {
      const client = pgClientOf(db)
      if (client !== undefined) {
        // PostgreSQL: the row as stored, in one statement (db/copy-out.ts).
        const [row] = await copyOutBinary(client, sql`
          SELECT sealed_by, data FROM ${attachmentChunks} WHERE upload_id = ${literal(uploadId)} AND seq = ${sql.raw(String(Math.trunc(seq)))}`)
        if (row === undefined) return undefined
        const [keyId, data] = row
        if (data === null || data === undefined) throw new Error(`attachment ${uploadId} chunk ${seq} has no bytes`)
        if (data.length > CHUNK_BYTES + SEAL_OVERHEAD) throw new Error(`attachment ${uploadId} chunk ${seq} holds ${data.length} bytes, more than a chunk`)
        return keyId === null || keyId === undefined ? [data] : keyring().openPieces([data], record.attachmentChunk(uploadId, seq), keyId.toString('utf8'))
      }
      // PGlite: its answers are text, a bytea as hex (parsed natively: db/client.ts), so a
      // chunk is read in slices (SLICE_BYTES).
      const slices: Buffer[] = []
      let stored = 0
      let sealedBy: string | null = null
      for (let offset = 0; offset === 0 || offset < stored; offset += SLICE_BYTES) {
        const [row] = await queryRows<ChunkSlice>(db, sql`
          SELECT sealed_by, octet_length(data) AS stored, substring(data FROM ${offset + 1}::int FOR ${SLICE_BYTES}::int) AS slice
          FROM ${attachmentChunks} WHERE upload_id = ${uploadId} AND seq = ${seq}`)
        // Gone (before the first slice, or deleted with its message mid-read).
        if (row === undefined) return undefined
        stored = Number(row.stored)
        sealedBy = row.sealed_by
        slices.push(bytesOf(row.slice))
      }
      // A row longer than any chunk can be was written by something else than this repository.
      if (stored > CHUNK_BYTES + SEAL_OVERHEAD) throw new Error(`attachment ${uploadId} chunk ${seq} holds ${stored} bytes, more than a chunk`)
      return sealedBy === null ? slices : keyring().openPieces(slices, record.attachmentChunk(uploadId, seq), sealedBy)
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
