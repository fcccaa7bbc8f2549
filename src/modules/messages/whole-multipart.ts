import type { IncomingHttpHeaders } from 'node:http'
import { Busboy, type BusboyConfig, type BusboyFileStream } from '@fastify/busboy'
import type { FastifyInstance } from 'fastify'
import secureJson from 'secure-json-parse'
import { ValidationFailed } from '../../errors.js'
import { INVALID_JSON_FIELD } from '../../plugins/errors.js'
import { boundaryOf, gateParts, PartsGate } from './multipart-parts.js'
import { heldFile } from './uploads.js'

type Limits = NonNullable<BusboyConfig['limits']>
type MultipartErrors = FastifyInstance['multipartErrors']

/** How much of a body busboy is given at a time: what it may parse past a limit (~1,000 empty parts, 10-20 ms of CPU). */
const SLICE_BYTES = 16 * 1024

/** What a body busboy cannot finish parsing is answered, on either path (uploads.plugin.ts). */
export const HEADERS_NEVER_END = 'body: malformed multipart/form-data: a part\'s headers never end'

/**
 * Parses a multipart body held whole into the fields @fastify/multipart's `keyValues` mode
 * makes of it while streaming: the same busboy with the same limits, the same errors (the
 * plugin's own, so errors.ts answers them alike), fields as strings (a field typed
 * application/json parsed, as the plugin does), a repeated field as a list in the body's
 * order, each file an UploadedFile holding its bytes. test/modules/messages/whole-multipart.test.ts
 * sends each of its cases both ways and asserts the same answer.
 *
 * Why: for a body of a few KiB the streaming path (the request piped into busboy, a part
 * iterator, a file stream per part, each awaited in turn) cost a send more of Node's time than
 * busboy's parsing did; this one costs ~45 µs a send less (BENCHMARKS.md, 2026-11-24 night).
 */
export async function parseWholeMultipart (headers: IncomingHttpHeaders, body: Buffer, limits: Limits, errors: MultipartErrors): Promise<Record<string, unknown>> {
  // Fields and files in the body's order; a file's value is filled in when its part ends.
  const entries: { name: string, value: unknown }[] = []
  const fileEnds: Promise<void>[] = []
  // As in the plugin, the first limit reached is the answer, else the last error seen.
  let limitError: Error | undefined
  let lastError: Error | undefined
  let failed = false
  const bb = new Busboy({ headers: headers as BusboyConfig['headers'], limits })
  const finished = new Promise<void>((resolve) => {
    bb.on('finish', resolve)
    bb.on('error', (err: Error) => {
      failed = true
      // An empty body is an empty form, as the plugin has it.
      if (body.length > 0 || err.message !== 'Unexpected end of multipart data') lastError = err
      resolve()
    })
  })
  bb.on('partsLimit', () => { limitError ??= new errors.PartsLimitError() })
  bb.on('filesLimit', () => { limitError ??= new errors.FilesLimitError() })
  bb.on('fieldsLimit', () => { limitError ??= new errors.FieldsLimitError() })
  bb.on('field', (name: string, value: string, _nameTruncated: boolean, valueTruncated: boolean, _encoding: string, contentType: string) => {
    if (name in Object.prototype) {
      lastError = new errors.PrototypeViolationError()
    } else if (contentType.startsWith('application/json')) {
      try {
        if (valueTruncated) throw new Error('truncated')
        entries.push({ name, value: secureJson.parse(value) })
      } catch {
        lastError = new ValidationFailed(INVALID_JSON_FIELD)
      }
    } else {
      entries.push({ name, value })
    }
  })
  bb.on('file', (name: string, stream: BusboyFileStream, filename: string, _encoding: string, mimetype: string) => {
    const entry: { name: string, value: unknown } = { name, value: undefined }
    if (name in Object.prototype) lastError = new errors.PrototypeViolationError()
    else entries.push(entry)
    const chunks: Buffer[] = []
    stream.on('data', (chunk: Buffer) => chunks.push(chunk))
    stream.on('limit', () => { lastError = new errors.RequestFileTooLargeError() })
    fileEnds.push(new Promise((resolve) => {
      stream.on('error', (err: Error) => {
        lastError = err
        resolve()
      })
      // Destroyed without an end (busboy gave up on it): its value stays unset, as the plugin leaves it.
      stream.on('close', resolve)
      stream.on('end', () => {
        // Usually one slice of the body, kept as it is: the body lives as long as the request.
        entry.value = heldFile(filename, mimetype, chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks))
        resolve()
      })
    }))
  })
  // Fed a slice at a time, and no more once a limit is reached: busboy parses every part it is
  // given, over the limit or not, and 256 KiB of empty parts cost it ~150 ms of CPU. Near the
  // parts limit, a slice is parsed a part at a time (multipart-parts.ts), as a streamed body is.
  const boundary = boundaryOf(headers)
  if (boundary !== undefined && limits.parts !== undefined) gateParts(bb, new PartsGate(boundary, limits.parts))
  for (let at = 0; at < body.length && limitError === undefined && !failed; at += SLICE_BYTES) {
    await new Promise<void>((resolve) => bb.write(body.subarray(at, at + SLICE_BYTES), () => resolve()))
  }
  if (limitError !== undefined) throw limitError
  bb.end()
  // busboy goes on by process.nextTick alone, and the body is all there: if it has not finished
  // once the event loop turns, it never will (a part whose headers never end waits for a blank
  // line that cannot come). The streaming path's watchdog answers such a body the same way.
  let settled = false
  void finished.then(() => { settled = true })
  await new Promise((resolve) => setImmediate(resolve))
  if (!settled) throw new ValidationFailed(HEADERS_NEVER_END)
  await Promise.all(fileEnds)
  const error = limitError ?? lastError
  if (error !== undefined) throw error
  // Names in Object.prototype were refused above, so these keys are plain.
  const byName: Record<string, unknown[]> = {}
  for (const { name, value } of entries) if (value !== undefined) (byName[name] ??= []).push(value)
  return Object.fromEntries(Object.entries(byName).map(([name, values]) => [name, values.length === 1 ? values[0] : values]))
}
