/**
 * An uploaded file, the domain's: what a send writes beside its message (send-batch.repository.ts)
 * and the attachment store (attachment-chunks.repository.ts) holds. Made only by the multipart
 * parsing beside it (uploads.ts, whole-multipart.ts).
 */

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
export function uploaded (filename: string | undefined, mimetype: string, uploadId: string, size: number, sha256: string, bytes?: Buffer): UploadedFile {
  return new UploadedFile(safeFilename(filename), safeContentType(mimetype), uploadId, size, sha256, bytes)
}

/**
 * A file part of a multipart body, stored chunk by chunk (under `uploadId`) and hashed as it
 * streamed in. Built only by the multipart parser, so a JSON or form body can never pass a
 * forged one off as a file: handlers check `instanceof UploadedFile`.
 */
export class UploadedFile {
  readonly filename: string
  readonly contentType: string
  readonly uploadId: string
  readonly size: number
  readonly sha256: string
  /**
   * The whole file, when it was small enough to stay in memory (see UploadProgress, uploads.ts): nothing
   * of it is staged, and the send writes it as the file's one chunk in its own statement.
   */
  readonly bytes?: Buffer

  constructor (filename: string, contentType: string, uploadId: string, size: number, sha256: string, bytes?: Buffer) {
    this.filename = filename
    this.contentType = contentType
    this.uploadId = uploadId
    this.size = size
    this.sha256 = sha256
    this.bytes = bytes
  }

  /** Whether chunks of this file were staged in the store (and need claiming or discarding). */
  get staged (): boolean {
    return this.bytes === undefined
  }

  /** The OpenAPI view of a file field. */
  toJSON (): { filename: string, contentType: string, size: number } {
    return { filename: this.filename, contentType: this.contentType, size: this.size }
  }
}
