import { createHash } from 'node:crypto'
import type { MultipartFile } from '@fastify/multipart'
import { giveTheLoopATurn } from '../../db/turns.js'
import { newId } from '../../ids.js'
import { uploaded, type UploadedFile } from './uploaded-file.js'

/** A file that arrived whole in memory (a body read whole: whole-multipart.ts), hashed here. */
export function heldFile (filename: string, mimetype: string, bytes: Buffer): UploadedFile {
  return uploaded(filename, mimetype, newId('upl'), bytes.length, createHash('sha256').update(bytes).digest('hex'), bytes)
}

/** Where a streaming upload puts its bytes: one chunk at a time, or all of them away again. */
export interface UploadSink {
  stage(uploadId: string, seq: number, data: Buffer): Promise<void>
  discard(uploadIds: string[]): Promise<number>
}

/**
 * One request's uploads. `writes`: chunk writes in progress (while one is, a paused body waits
 * on us, not on the parser). `inlineBytesLeft`: how many more bytes of whole small files this
 * request may keep in memory instead of staging them; at most one chunk's worth a request, so
 * memory per upload stays one chunk, while a message with a small image is written by one
 * statement and one commit instead of a staging insert, the send, and a clean-up delete.
 */
export interface UploadProgress { writes: number, inlineBytesLeft: number }

/**
 * Streams a file part into the sink in chunks of exactly `chunkBytes` (the last shorter),
 * awaiting each insert before reading on, so memory per upload stays about one chunk plus the
 * socket's buffers and a slow database slows the client instead of filling memory. busboy
 * stops the stream at the configured fileSize and @fastify/multipart then throws its 413
 * error. On any failure what was staged is deleted before the error goes on.
 */
export async function readUpload (part: MultipartFile, sink: UploadSink, chunkBytes: number, storing: UploadProgress = { writes: 0, inlineBytesLeft: 0 }): Promise<UploadedFile> {
  const uploadId = newId('upl')
  const hash = createHash('sha256')
  let pending: Buffer[] = []
  let pendingBytes = 0
  let seq = 0
  let size = 0
  const flush = async (upTo: number) => {
    const all = pending.length === 1 ? pending[0]! : Buffer.concat(pending, pendingBytes)
    // Copy the chunk out so the rest of a large socket buffer is not kept alive by it.
    storing.writes++
    try {
      await sink.stage(uploadId, seq++, Buffer.from(all.subarray(0, upTo)))
      // The socket usually has the next chunk buffered already (db/turns.ts).
      await giveTheLoopATurn()
    } finally {
      storing.writes--
    }
    const rest = all.subarray(upTo)
    pending = rest.length > 0 ? [rest] : []
    pendingBytes = rest.length
  }
  try {
    for await (const chunk of part.file) {
      const buf = chunk as Buffer
      hash.update(buf)
      size += buf.length
      pending.push(buf)
      pendingBytes += buf.length
      while (pendingBytes >= chunkBytes) await flush(chunkBytes)
    }
    // busboy ends the stream early (not with an error) at fileSize, and @fastify/multipart
    // answers 413 once the body is read: nothing of this file is kept.
    if (part.file.truncated) await sink.discard([uploadId])
    else if (seq === 0 && pendingBytes <= storing.inlineBytesLeft) {
      storing.inlineBytesLeft -= pendingBytes
      const bytes = Buffer.concat(pending, pendingBytes)
      return uploaded(part.filename, part.mimetype, uploadId, size, hash.digest('hex'), bytes)
    } else if (pendingBytes > 0) await flush(pendingBytes)
  } catch (err) {
    await sink.discard([uploadId]).catch(() => {})
    throw err
  }
  return uploaded(part.filename, part.mimetype, uploadId, size, hash.digest('hex'))
}
