import { and, asc, eq, gte, inArray, isNull, lte, sql } from 'drizzle-orm'
import type { Db } from '../../db/client.js'
import { attachmentChunks } from './messages.table.js'

/**
 * Bytes per stored chunk. 256 KiB keeps each insert and each download query short (a few ms),
 * so on PGlite's one connection other requests interleave, and memory per upload stays small.
 * The last chunk of a file is shorter; every other is exactly this long, so a byte offset maps
 * to a chunk by division. The 0004 migration splits existing files with the same figure.
 */
export const CHUNK_BYTES = 256 * 1024

/** Unclaimed chunks older than this belong to no live upload (a crash mid-upload): swept. */
const STAGED_TTL_MS = 60 * 60 * 1000

/**
 * Staged and stored attachment bytes. Every call is one short autocommit statement: the
 * connection is taken and released per chunk, never held while a client is still sending.
 * Buffers travel to `pg` as binary parameters (node-postgres sends a Buffer in binary format).
 */
export function createAttachmentChunksRepository (db: Db) {
  return {
    async stage (uploadId: string, seq: number, data: Buffer): Promise<void> {
      await db.insert(attachmentChunks).values({ uploadId, seq, data })
    },

    /** Deletes what the uploads staged unless a send claimed it. */
    async discard (uploadIds: string[]): Promise<number> {
      if (uploadIds.length === 0) return 0
      const gone = await db.delete(attachmentChunks)
        .where(and(inArray(attachmentChunks.uploadId, uploadIds), isNull(attachmentChunks.messageId)))
        .returning({ seq: attachmentChunks.seq })
      return gone.length
    },

    /** Chunks `from`..`to` (inclusive) of a stored file, in order. */
    async read (uploadId: string, from: number, to: number): Promise<Buffer[]> {
      const rows = await db.select({ data: attachmentChunks.data }).from(attachmentChunks)
        .where(and(eq(attachmentChunks.uploadId, uploadId), gte(attachmentChunks.seq, from), lte(attachmentChunks.seq, to)))
        .orderBy(asc(attachmentChunks.seq))
      // PGlite answers bytea as a plain Uint8Array; wrap it without copying.
      return rows.map(({ data }) => Buffer.isBuffer(data) ? data : Buffer.from((data as Uint8Array).buffer, (data as Uint8Array).byteOffset, (data as Uint8Array).byteLength))
    },

    /**
     * Bytes `offset`..`offset + length` of one chunk of a stored file (empty past its end). For
     * reads of whole files at the database's pace (exports): node-postgres hands bytea over as
     * a hex string twice its size, and a string over 128 KiB lives in V8's large-object space
     * until a full collection, so 1 MiB a query grew a server by 150 MB over a 1 GiB export;
     * slices of SLICE_BYTES make strings the young generation frees at once. On an incompressible
     * file (most uploads) PostgreSQL reads only the TOAST pages of the slice.
     */
    async readSlice (uploadId: string, seq: number, offset: number, length: number): Promise<Buffer | undefined> {
      const [row] = await db.select({ data: sql<Buffer>`substring(${attachmentChunks.data} FROM ${offset + 1}::int FOR ${length}::int)` }).from(attachmentChunks)
        .where(and(eq(attachmentChunks.uploadId, uploadId), eq(attachmentChunks.seq, seq)))
      if (row === undefined) return undefined
      const data = row.data as Buffer | Uint8Array | string
      if (Buffer.isBuffer(data)) return data
      if (typeof data === 'string') return Buffer.from(data.startsWith('\\x') ? data.slice(2) : data, 'hex')
      return Buffer.from(data.buffer, data.byteOffset, data.byteLength)
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
