import { createHash } from 'node:crypto'
import type { MultipartFile } from '@fastify/multipart'

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
  return new UploadedFile(part.filename, part.mimetype, Buffer.concat(chunks), hash.digest('hex'))
}
