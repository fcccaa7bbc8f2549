import type { IncomingHttpHeaders } from 'node:http'
import { createRequire } from 'node:module'

const require = createRequire(import.meta.url)
/** busboy's own reading of a Content-Type's parameters: the boundary here is the one it parses with, byte for byte. */
const parseParams = require('@fastify/busboy/lib/utils/parseParams') as (header: string) => (string | [string, string])[]

/** The boundary busboy will split a multipart body on, or undefined where it will refuse the body itself. */
export function boundaryOf (headers: IncomingHttpHeaders): string | undefined {
  const contentType = headers['content-type']
  if (contentType === undefined) return undefined
  // As busboy's Multipart: the first parameter named boundary, in any case.
  for (const param of parseParams(contentType)) {
    if (Array.isArray(param) && /^boundary$/i.test(param[0])) return param[1]
  }
  return undefined
}

/**
 * How much of a multipart body busboy is to be given: everything before its (parts + 2)-th
 * delimiter, and nothing after.
 *
 * Why: busboy parses every part it is given, over its parts limit or not, and a part can be 16
 * bytes; 64 KiB of empty parts cost it ~16-70 ms of CPU, on the event loop every other key's
 * requests wait on, and a streamed body reached it 64 KiB at a time until the refusal had
 * unpiped it (~128 KiB each in noisy-neighbour's case). Cut here, it sees a few parts more than
 * its limit, raises the same partsLimit as before, and the answer is the same 400.
 *
 * A body that is not over the limit is never cut short of what busboy reads: a delimiter is
 * "\r\n--" and the boundary (busboy's own search, deps/dicer), a body of at most `parts` parts
 * has at most parts + 1 of them up to its closing one, and what follows that (the epilogue) busboy
 * ignores. Delimiters split across chunks are counted once.
 */
export class PartsCut {
  private readonly delimiter: Buffer
  private readonly limit: number
  private seen = 0
  private cut = false
  /** The end of the last chunk, too short to hold a whole delimiter: where one split across chunks begins. */
  private tail = Buffer.alloc(0)

  constructor (boundary: string, parts: number) {
    this.delimiter = Buffer.from('\r\n--' + boundary)
    this.limit = parts + 2
  }

  /** The part of the next chunk busboy is to be given: all of it, what comes before the cut, or nothing once cut. */
  take (chunk: Buffer): Buffer {
    if (this.cut) return chunk.subarray(0, 0)
    const length = this.delimiter.length
    // Matches do not overlap, as busboy's search finds them: the next is looked for after the last.
    let from = 0
    if (this.tail.length > 0) {
      // A match here began in the tail (the chunk's own start holds none whole): the cut, if it
      // is one, fell in bytes already given, so nothing of this chunk is.
      const seam = Buffer.concat([this.tail, chunk.subarray(0, length - 1)])
      for (let at = seam.indexOf(this.delimiter); at !== -1; at = seam.indexOf(this.delimiter, at + length)) {
        if (++this.seen >= this.limit) return this.stop(chunk, 0)
        from = at + length - this.tail.length
      }
    }
    for (let at = chunk.indexOf(this.delimiter, from); at !== -1; at = chunk.indexOf(this.delimiter, at + length)) {
      if (++this.seen >= this.limit) return this.stop(chunk, at)
      from = at + length
    }
    // What may begin a match split across this chunk and the next; a copy, not a view that would keep the chunk.
    // (from > 0 once a match is found: the bytes before it, the old tail among them, begin none.)
    const rest = from === 0 && chunk.length < length - 1 ? Buffer.concat([this.tail, chunk]) : chunk.subarray(Math.max(from, chunk.length - (length - 1)))
    this.tail = Buffer.from(rest.subarray(Math.max(0, rest.length - (length - 1))))
    return chunk
  }

  private stop (chunk: Buffer, at: number): Buffer {
    this.cut = true
    this.tail = Buffer.alloc(0)
    return chunk.subarray(0, at)
  }
}
