import { createHash } from 'node:crypto'
import { setImmediate } from 'node:timers/promises'
import type { MultipartFile } from '@fastify/multipart'
import { newId } from '../ids.js'

const TOKEN = /^[A-Za-z0-9!#$&^_.+-]+\/[A-Za-z0-9!#$&^_.+-]+$/

/** The uploaded type when it is a plain `type/subtype`, else application/octet-stream. */
function safeContentType (given: string): string {
  return TOKEN.test(given) && given.length <= 127 ? given.toLowerCase() : 'application/octet-stream'
}

/**
 * A filename fit to store: no path, no control characters, no bidi embedding/override/isolate
 * controls (which make `exe.txt` display as `txt.exe`), at most 255 characters.
 */
function safeFilename (given: string | undefined): string {
  // eslint-disable-next-line no-control-regex
  const base = (given ?? '').split(/[\\/]/).pop()!.replace(/[\u0000-\u001f\u007f\u202a-\u202e\u2066-\u2069]/g, '').trim()
  return [...(base === '' || base === '.' || base === '..' ? 'attachment' : base)].slice(0, 255).join('')
}

/** An uploaded file as stored: its name and type as the client gave them, made safe to keep. */
function uploaded (filename: string | undefined, mimetype: string, uploadId: string, size: number, sha256: string, bytes?: Buffer): UploadedFile {
  return new UploadedFile(safeFilename(filename), safeContentType(mimetype), uploadId, size, sha256, bytes)
}

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
 * A file part of a multipart body, stored chunk by chunk (under `uploadId`) and hashed as it
 * streamed in. Built only by the multipart parser, so a JSON or form body can never pass a
 * forged one off as a file: handlers check `instanceof UploadedFile`.
 */
export class UploadedFile {
  constructor (
    readonly filename: string,
    readonly contentType: string,
    readonly uploadId: string,
    readonly size: number,
    readonly sha256: string,
    /**
     * The whole file, when it was small enough to stay in memory (see UploadProgress): nothing
     * of it is staged, and the send writes it as the file's one chunk in its own statement.
     */
    readonly bytes?: Buffer
  ) {}

  /** Whether chunks of this file were staged in the store (and need claiming or discarding). */
  get staged (): boolean {
    return this.bytes === undefined
  }

  /** The OpenAPI view of a file field. */
  toJSON (): { filename: string, contentType: string, size: number } {
    return { filename: this.filename, contentType: this.contentType, size: this.size }
  }
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
      // A turn of the event loop between chunks. With the embedded database (in this process)
      // a chunk's insert resolves without any I/O, and the socket usually has the next chunk
      // buffered: the whole upload would then run as one chain of microtasks, and no other
      // request could even be read until it ended (an event-loop lag of ~100 ms at 10 x 8 MiB).
      await setImmediate()
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
