import multipart from '@fastify/multipart'
import type { FastifyInstance, FastifyRequest } from 'fastify'
import fp from 'fastify-plugin'
import type { Db } from '../../db/client.js'
import { loggableError } from '../../db/errors.js'
import { ValidationFailed } from '../../errors.js'
import { sendError } from '../../plugins/errors.js'
import { CHUNK_BYTES, createAttachmentChunksRepository } from './attachment-chunks.repository.js'
import { boundaryOf, gateParts, PartsGate } from './multipart-parts.js'
import { UploadedFile } from './uploaded-file.js'
import { readUpload, type UploadProgress } from './uploads.js'
import { HEADERS_NEVER_END, parseWholeMultipart } from './whole-multipart.js'

/** The most non-file fields a multipart body may have. */
const MULTIPART_FIELDS = 32

/** How long reading a multipart body may stand still on the parser's side before it counts as malformed. */
const MULTIPART_STALL_MS = 2_000

export interface UploadsPluginOptions {
  /** Where file parts are streamed to, chunk by chunk (the attachment store). */
  db: Db
  maxAttachments: number
  maxAttachmentBytes: number
  maxBodyChars: number
}

/**
 * multipart/form-data bodies, for the routes that take files (`acceptsFiles`): their fields as
 * the flat object JSON and form bodies make (plugins/body-parsers.ts), each file an
 * UploadedFile, its bytes streamed into the attachment store as they arrive. Here, beside the
 * store and the sends that claim what it staged, rather than among the plugins, which name no
 * module's type; app.ts registers it at the root, after the body parsers.
 */
export const uploadsPlugin = fp(async (app: FastifyInstance, opts: UploadsPluginOptions) => {
  const uploads = createAttachmentChunksRepository(opts.db)
  // busboy's limits, for the plugin and for whole bodies alike. Parts: no more than the fields
  // and files a message may have (the plugin's default, 1,000, let a body of empty parts cost
  // busboy far more to parse than any send).
  const limits = {
    fileSize: opts.maxAttachmentBytes,
    files: opts.maxAttachments,
    fields: MULTIPART_FIELDS,
    // A body of MAX_BODY_CHARS characters, each up to 4 bytes of UTF-8.
    fieldSize: Math.max(opts.maxBodyChars * 4, 1024),
    headerPairs: 100,
    parts: MULTIPART_FIELDS + opts.maxAttachments
  }
  // A body of at most one chunk whose length is announced is read whole and parsed in one go
  // (whole-multipart.ts): every file in it would be held in memory anyway (inlineBytesLeft), so
  // nothing is staged, and no parser can stall on a body it already has whole. Registered before
  // the plugin's own hook (hooks run in order) and before the stall watchdog: once the body is
  // parsed, isMultipart() answers false for this request, and both leave it alone.
  app.addHook('preValidation', async (req) => {
    if (req.routeOptions.config.acceptsFiles !== true || !req.isMultipart()) return
    const length = Number(req.headers['content-length'])
    if (!Number.isInteger(length) || length > CHUNK_BYTES) return
    const chunks: Buffer[] = []
    for await (const chunk of req.raw) chunks.push(chunk as Buffer)
    const body = chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks)
    req.body = await parseWholeMultipart(req.headers, body, limits, app.multipartErrors)
    Object.defineProperty(req, 'isMultipart', { value: () => false })
  })
  // A streamed body is handed to busboy a part at a time near its parts limit, and no more of it
  // once busboy raised that limit (multipart-parts.ts): the plugin pipes the request into its
  // busboy once its hook below asks for the parts, and that busboy's _write (what parses each
  // chunk written, one at a time, Writable's own queue in front) takes the gate's pieces in
  // turn. The pipe itself is left as it is, so the plugin's unpipe and the onError hook's below
  // work on it unchanged.
  app.addHook('preValidation', async (req) => {
    if (req.routeOptions.config.acceptsFiles !== true || !req.isMultipart()) return
    const boundary = boundaryOf(req.headers)
    if (boundary === undefined) return
    const raw = req.raw
    Object.defineProperty(raw, 'pipe', {
      configurable: true,
      value: function pipeGated<T extends NodeJS.WritableStream> (dest: T, options?: { end?: boolean }): T {
        Reflect.deleteProperty(raw, 'pipe')
        gateParts(dest, new PartsGate(boundary, limits.parts))
        return raw.pipe(dest, options)
      }
    })
  })
  // @fastify/busboy can stall for ever on a malformed body: a part whose headers never end
  // waits for a blank line that never comes, and stops reading the request. A multipart body
  // whose reading has stood still for MULTIPART_STALL_MS (read whole but not parsed, or paused
  // by the parser rather than waiting on the client) is answered 400 and its connection closed.
  const watchdogs = new WeakMap<FastifyRequest, NodeJS.Timeout>()
  // A body paused while its chunk is being stored waits on the database, not on a broken part:
  // a busy database slows the client down (backpressure) and must not get its upload refused.
  const storing = new WeakMap<FastifyRequest, UploadProgress>()
  app.addHook('preValidation', async (req, reply) => {
    if (req.routeOptions.config.acceptsFiles !== true || !req.isMultipart()) return
    let stillSince: number | undefined
    const progress: UploadProgress = { writes: 0, inlineBytesLeft: CHUNK_BYTES }
    storing.set(req, progress)
    watchdogs.set(req, setInterval(() => {
      const still = progress.writes === 0 && (req.raw.readableEnded || req.raw.readableFlowing === false)
      stillSince = still ? stillSince ?? Date.now() : undefined
      if (stillSince === undefined || Date.now() - stillSince < MULTIPART_STALL_MS) return
      clearInterval(watchdogs.get(req))
      if (reply.sent) return
      reply.header('connection', 'close')
      sendError(reply, new ValidationFailed(HEADERS_NEVER_END))
    }, MULTIPART_STALL_MS / 4).unref())
  })
  app.addHook('onResponse', async (req) => { clearInterval(watchdogs.get(req)) })
  // A streamed body refused part-way (a limit, a malformed part) is parsed no further: busboy
  // would parse every part left, however many (the plugin keeps it going after a limit), so the
  // rest is read and dropped instead, and the connection stays usable.
  app.addHook('onError', async (req) => {
    if (req.routeOptions.config.acceptsFiles !== true || req.raw.readableEnded) return
    req.raw.unpipe()
    req.raw.resume()
  })

  await app.register(multipart, {
    attachFieldsToBody: 'keyValues',
    limits,
    async onFile (part) {
      const req = this
      let file: UploadedFile
      try {
        file = await readUpload(part, uploads, CHUNK_BYTES, storing.get(req))
      } catch (err) {
        // A socket closed mid-body is the client's doing, not the database's: say so.
        if (req.raw.destroyed || (err as { code?: string }).code === 'FST_PREMATURE_CLOSE') {
          req.log.info({ field: part.fieldname }, 'upload aborted by the client; its staged chunks were deleted')
        }
        throw err
      }
      if (file.staged) {
        const ids = staged.get(req) ?? []
        ids.push(file.uploadId)
        staged.set(req, ids)
      }
      // keyValues mode stores `part.value` as the field's value.
      Object.assign(part, { value: file })
    }
  })
  // Whatever the request ends with (refused send, 4xx, 5xx, abort), its uploads that no send
  // claimed are deleted; a claimed chunk has message_id set and is left alone.
  const staged = new WeakMap<FastifyRequest, string[]>()
  const discardUnclaimed = async (req: FastifyRequest) => {
    const ids = staged.get(req)
    if (ids === undefined) return
    staged.delete(req)
    await uploads.discard(ids).catch((err: unknown) => {
      req.log.warn({ err: loggableError(err) }, 'could not delete unclaimed upload chunks; retention sweeps them')
    })
  }
  // onRequestAbort fires only while the body is still being read (Fastify checks req.aborted on
  // the request's close): a client hanging up after its body was parsed, its send queued for a
  // batch, cannot discard chunks that send is about to claim (send-batch test pins this).
  app.addHook('onResponse', discardUnclaimed)
  app.addHook('onRequestAbort', discardUnclaimed)

  // One file part arrives as a value, several as a list; a schema sees a list either way
  // (Ajv's array coercion wraps scalars only, not objects).
  app.addHook('preValidation', async (req) => {
    clearInterval(watchdogs.get(req))
    if (req.routeOptions.config.acceptsFiles !== true || typeof req.body !== 'object' || req.body === null) return
    const body = req.body as Record<string, unknown>
    for (const [name, value] of Object.entries(body)) {
      if (value instanceof UploadedFile) body[name] = [value]
    }
  })
}, { name: 'parley-uploads', dependencies: ['parley-body-parsers'] })
