import { createHash } from 'node:crypto'
import type { MultipartFile } from '@fastify/multipart'

const TOKEN = /^[A-Za-z0-9!#$&^_.+-]+\/[A-Za-z0-9!#$&^_.+-]+$/

/** The uploaded type when it is a plain `type/subtype`, else application/octet-stream. */
export function safeContentType (given: string): string {
  return TOKEN.test(given) && given.length <= 127 ? given.toLowerCase() : 'application/octet-stream'
}

/** A filename fit to store: no path, no control characters, at most 255 characters. */
export function safeFilename (given: string | undefined): string {
  // eslint-disable-next-line no-control-regex
  const base = (given ?? '').split(/[\\/]/).pop()!.replace(/[\u0000-\u001f\u007f]/g, '').trim()
  return [...(base === '' || base === '.' || base === '..' ? 'attachment' : base)].slice(0, 255).join('')
}

/**
 * A file part of a multipart body, read whole and hashed as it streamed in. Built only by the
 * multipart parser, so a JSON or form body can never pass a forged one off as a file: handlers
 * check `instanceof UploadedFile`.
 */
export class UploadedFile {
  constructor (
    readonly filename: string,
    readonly contentType: string,
    readonly data: Buffer,
    readonly sha256: string
  ) {}

  get size (): number {
    return this.data.length
  }

  /** The OpenAPI view of a file field. */
  toJSON (): { filename: string, contentType: string, size: number } {
    return { filename: this.filename, contentType: this.contentType, size: this.size }
  }
}

/**
 * Reads a file part while it arrives. busboy stops the stream at the configured fileSize and
 * @fastify/multipart then throws its 413 error, so nothing oversized is kept.
 */
export async function readUpload (part: MultipartFile): Promise<UploadedFile> {
  const hash = createHash('sha256')
  const chunks: Buffer[] = []
  for await (const chunk of part.file) {
    hash.update(chunk as Buffer)
    chunks.push(chunk as Buffer)
  }
  return new UploadedFile(safeFilename(part.filename), safeContentType(part.mimetype), Buffer.concat(chunks), hash.digest('hex'))
}
