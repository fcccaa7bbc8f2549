import type { IncomingHttpHeaders } from 'node:http'
import { createRequire } from 'node:module'
import type { Writable } from 'node:stream'

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
 * Hands busboy a multipart body so that it parses at most a part or two past its parts limit.
 *
 * Why: busboy parses every part it is given, over its limit or not, and a part can be 16 bytes:
 * 64 KiB of empty parts cost it 16-70 ms of CPU, on the event loop every other key's requests
 * wait on, and a streamed body reached it 64 KiB at a time until the refusal had unpiped it
 * (~128 KiB a request in noisy-neighbour's case).
 *
 * busboy still decides: its own partsLimit is the refusal, with the plugin's error, and what it
 * parses is what it parsed before. Once it has refused, it is given the closing delimiter in
 * place of the rest, so it ends as it ends a whole body: left to end short of one, it answered
 * "Unexpected end of multipart data" in place of the limit, through a file it was still
 * handing over before the limit. Its delimiter ("\r\n--" and the boundary, deps/dicer) is only
 * counted here, and from the `parts`-th on (busboy sees at most one part more than there are
 * delimiters, so none sooner can be over its limit) a chunk is handed over one delimiter at a
 * time, until the caller closes the gate on busboy's partsLimit. Counting cannot match dicer's
 * rules exactly (a delimiter right after another and a dash is not one to dicer, nor anything
 * after the closing one): past 2 × (parts + 2) delimiters without a partsLimit, chunks go whole
 * again, as they did before, so a body busboy does not refuse is never handed over in thousands
 * of pieces.
 */
export class PartsGate {
  readonly #delimiter: Buffer
  /** What ends a body: the closing delimiter, given to busboy once it has refused the rest. */
  readonly closing: Buffer
  /** The delimiters from which chunks are split: the parts-th to the last before `#whole`. */
  readonly #from: number
  readonly #whole: number
  #seen = 0
  #closed = false
  /** The end of the last chunk, too short to hold a whole delimiter: where one split across chunks begins. */
  #tail = Buffer.alloc(0)

  constructor (boundary: string, parts: number) {
    this.#delimiter = Buffer.from('\r\n--' + boundary)
    this.closing = Buffer.from('\r\n--' + boundary + '--\r\n')
    this.#from = parts
    this.#whole = 2 * (parts + 2)
  }

  /** On busboy's partsLimit: what is left of the body is not its to parse. */
  close (): void {
    this.#closed = true
  }

  get closed (): boolean {
    return this.#closed
  }

  /**
   * The next chunk as busboy is to be given it, piece by piece, the caller looking between two
   * pieces for a partsLimit: the chunk whole, or split before each delimiter near the limit.
   * Joined, the pieces are the chunk; none once the gate is closed.
   */
  pieces (chunk: Buffer): Buffer[] {
    if (this.#closed) return []
    // Past the last delimiter it would split before, it looks no more.
    if (this.#seen >= this.#whole) return [chunk]
    const length = this.#delimiter.length
    const splits: number[] = []
    // Matches do not overlap, as dicer's search finds them: the next is looked for after the last.
    let from = 0
    if (this.#tail.length > 0) {
      // A match here began in the tail (the chunk's own start holds none whole): this chunk
      // already starts a piece of its own.
      const seam = Buffer.concat([this.#tail, chunk.subarray(0, length - 1)])
      for (let at = seam.indexOf(this.#delimiter); at !== -1; at = seam.indexOf(this.#delimiter, at + length)) {
        this.#seen++
        from = at + length - this.#tail.length
      }
    }
    for (let at = chunk.indexOf(this.#delimiter, from); at !== -1; at = chunk.indexOf(this.#delimiter, at + length)) {
      this.#seen++
      if (this.#seen >= this.#from && this.#seen < this.#whole && at > 0) splits.push(at)
      from = at + length
    }
    // (from > 0 once a match is found: the bytes before it, the old tail among them, begin none.)
    const rest = from === 0 && chunk.length < length - 1 ? Buffer.concat([this.#tail, chunk]) : chunk.subarray(Math.max(from, chunk.length - (length - 1)))
    // A copy, not a view that would keep the chunk.
    this.#tail = Buffer.from(rest.subarray(Math.max(0, rest.length - (length - 1))))
    if (splits.length === 0) return [chunk]
    return [0, ...splits].map((start, i) => chunk.subarray(start, splits[i] ?? chunk.length))
  }
}

/**
 * busboy's parse of each chunk written to it, in `gate`'s pieces; once busboy raised its
 * partsLimit, the closing delimiter, then nothing. Its _write is what parses a chunk, one at a
 * time with Writable's own queue in front, and calls back when busboy is ready for the next:
 * the pieces are handed over in turn.
 */
export function gateParts (busboy: NodeJS.WritableStream, gate: PartsGate): void {
  const writable = busboy as Writable
  writable.once('partsLimit', () => gate.close())
  const parse = writable._write.bind(writable)
  /** Whether busboy has been given the closing delimiter (gate.closed: whether it is due). */
  let closingGiven = false
  writable._write = (chunk: Buffer, encoding: BufferEncoding, done: (err?: Error | null) => void) => {
    const pieces = gate.pieces(chunk)
    let next = 0
    const step = (err?: Error | null): void => {
      if (err != null) {
        done(err)
      } else if (gate.closed) {
        if (closingGiven) return done()
        closingGiven = true
        parse(gate.closing, encoding, done)
      } else if (next === pieces.length) {
        done()
      } else {
        parse(pieces[next++]!, encoding, step)
      }
    }
    step()
  }
}
