import { and, inArray, isNull, lte, sql } from 'drizzle-orm'
import type { Db } from '../../db/client.js'
import { queryRows } from '../../db/rows.js'
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

/**
 * Bytes of a stored chunk read per column: node-postgres hands bytea over as a hex string twice
 * its size, and a string over 128 KiB lives in V8's large-object space until a full collection
 * (1 MiB a query grew a server by 150 MB over a 1 GiB export); 60 KiB slices make strings the
 * young generation frees at once. A chunk is read whole (a sealed one opens only whole) as
 * several such slices, each its own column of one statement.
 */
const SLICE_BYTES = 60 * 1024

/** Slices of the longest row a chunk can have: a whole chunk, sealed. */
const SLICES = Math.ceil((CHUNK_BYTES + SEAL_OVERHEAD) / SLICE_BYTES)

/** Unclaimed chunks older than this belong to no live upload (a crash mid-upload): swept. */
const STAGED_TTL_MS = 60 * 60 * 1000

/** bytea as either driver answers it: a Buffer or hex text (node-postgres), a Uint8Array (PGlite). */
function bytesOf (data: Buffer | Uint8Array | string): Buffer {
  if (Buffer.isBuffer(data)) return data
  if (typeof data === 'string') return Buffer.from(data.startsWith('\\x') ? data.slice(2) : data, 'hex')
  // Wrapped, not copied.
  return Buffer.from(data.buffer, data.byteOffset, data.byteLength)
}

/** One stored chunk's row: its slices (SLICES columns), its length as stored, and its key. */
interface ChunkRow {
  sealed_by: string | null
  stored: number
  [slice: `s${number}`]: Buffer | Uint8Array | string | null
}

const sliceColumns = sql.join(Array.from({ length: SLICES }, (_, i) =>
  sql.raw(`substring(data FROM ${i * SLICE_BYTES + 1} FOR ${SLICE_BYTES}) AS s${i}`)), sql`, `)

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
     * is), in pieces of about SLICE_BYTES; undefined when there is no such row. One statement,
     * in slices of SLICE_BYTES, so no string the driver makes is a large object and no buffer
     * is a chunk's size, however the file is read (downloads, Ranges, exports). SealedKeyMissing
     * (503) when its key is no longer configured.
     */
    async readChunk (uploadId: string, seq: number): Promise<Buffer[] | undefined> {
      const [row] = await queryRows<ChunkRow>(db, sql`
        SELECT sealed_by, octet_length(data) AS stored, ${sliceColumns} FROM ${attachmentChunks}
        WHERE upload_id = ${uploadId} AND seq = ${seq}`)
      if (row === undefined) return undefined
      const slices: Buffer[] = []
      for (let i = 0; i < SLICES; i++) {
        const slice = row[`s${i}`]
        if (slice !== null && slice !== undefined) slices.push(bytesOf(slice))
      }
      // A row longer than any chunk can be was written by something else than this repository.
      const stored = piecesLength(slices)
      if (stored !== Number(row.stored)) throw new Error(`attachment ${uploadId} chunk ${seq} holds ${row.stored} bytes, more than a chunk`)
      return row.sealed_by === null ? slices : keyring().openPieces(slices, record.attachmentChunk(uploadId, seq), row.sealed_by)
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
