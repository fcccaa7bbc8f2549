import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import { piecesBetween } from '../../sealing/pieces.js'
import { Type } from 'typebox'
import type { Db } from '../../db/client.js'
import { giveTheLoopATurn } from '../../db/turns.js'
import type { Metrics } from '../../metrics.js'
import { AppError, NotFound, ValidationFailed } from '../../errors.js'
import { principalOf } from '../../plugins/auth.js'
import { UploadedFile } from './uploaded-file.js'
import { AUTHENTICATED_ERRORS, errorResponses, NoContent } from '../../schemas.js'
import { quotaHeaders } from '../quota/quota.repository.js'
import { keyring } from '../../sealing/keyring.js'
import { Readable } from 'node:stream'
import { CHUNK_BYTES, createAttachmentChunksRepository, type AttachmentChunksRepository } from './attachment-chunks.repository.js'
import { parseRange } from './byte-range.js'
import { contentDisposition } from './content-disposition.js'
import { deleteMessage } from './delete.service.js'
import { editMessage } from './edit.service.js'
import { react } from './reactions.service.js'
import { readableMessage } from './access.service.js'
import { createMessagesRepository } from './messages.repository.js'
import {
  AttachmentFile, AttachmentParams, EditedMessage, editMessageBody, MessageParams, ReactionParams, MessageSchema, MessageStatusSchema, ReportStatusBody, SendMessageHeaders,
  SendRefused, SentMessage, sendMessageBody, sendMessageWireBody, TypingBody, TypingParams
} from './messages.schemas.js'
import { messageStatus, reportStatus } from './receipts.service.js'
import { createSendService } from './send.service.js'
import { createTyping } from './typing.service.js'

export interface MessagesRoutesOptions {
  db: Db
  maxBodyChars: number
  /** MESSAGE_EDIT_WINDOW_SECONDS. */
  editWindowSeconds: number
  metrics: Metrics
  /** Send batches in flight at once per lane (see sendBatches in send-lanes.ts). */
  sendBatches: number
  /** The app's clock (ms since the epoch): typing's allowance refills on it. */
  now: () => number
}

export const messagesRoutes: FastifyPluginAsyncTypebox<MessagesRoutesOptions> = async (app, { db, maxBodyChars, editWindowSeconds, metrics, sendBatches, now }) => {
  const typing = createTyping(db, now)
  const messages = createMessagesRepository(db)
  const sending = createSendService(db, {
    concurrency: sendBatches,
    onBatch: (size) => metrics.sendBatch(size),
    onStage: (stage, seconds) => metrics.sendStage(stage, seconds)
  })
  metrics.gauge('parley_send_recipients_held', 'Recipients whose sends met a lock held by other work (the recipient\'s feed row, the group, or the sender key\'s quota row) and try again one at a time',
    () => [{ value: sending.heldRecipients() }])
  const store = createAttachmentChunksRepository(db)

  app.post('/message', {
    config: {
      acceptsFiles: true,
      // The document shows the body per content type (sendMessageWireBody); one schema checks all three.
      swaggerTransform: ({ schema, url }) => ({ schema: { ...schema, body: sendMessageWireBody(maxBodyChars) }, url })
    },
    schema: {
      operationId: 'sendMessage',
      tags: ['messages'],
      summary: 'Send a message',
      description: 'To a user address or a group id, as JSON, a form, or multipart/form-data with `attachment` file parts. ' +
        'Counts against the key\'s daily quota (X-Quota-* headers). With Idempotency-Key (kept 24 h per API key), a retry ' +
        'with the same fields answers the original message (Idempotent-Replayed: true), sends nothing and counts no quota; ' +
        'with other fields 422 IDEMPOTENCY_MISMATCH; while the first send is still in flight 409 IDEMPOTENCY_IN_PROGRESS ' +
        '(retry shortly); after its sender deleted that message 404 NOT_FOUND ("message msg_… sent with this ' +
        'Idempotency-Key was deleted"), sending nothing and counting no quota: the erased body cannot be answered, and a ' +
        'new send would break the promise that a retry sends nothing new.',
      consumes: ['application/json', 'application/x-www-form-urlencoded', 'multipart/form-data'],
      headers: SendMessageHeaders,
      body: sendMessageBody(maxBodyChars),
      response: { 200: SentMessage, ...errorResponses(...AUTHENTICATED_ERRORS, 403, 404, 409, 413, 415, 422), 429: SendRefused }
    }
  }, async (req, reply) => {
    const principal = principalOf(req)
    const files = req.body.attachment ?? []
    if (!files.every((f) => f instanceof UploadedFile)) {
      throw new ValidationFailed('attachment: files are sent as multipart/form-data file parts')
    }
    const result = await sending.send({
      principal,
      recipient: req.body.recipient,
      body: req.body.body ?? '',
      files,
      replyTo: req.body.replyTo,
      idempotencyKey: req.headers['idempotency-key']
    })
    reply.headers(quotaHeaders(result.quota))
    if (result.replayed) reply.header('idempotent-replayed', 'true')
    else metrics.messageSent()
    return result.message
  })

  app.get('/message/:message/status', {
    schema: {
      operationId: 'getMessageStatus',
      tags: ['messages'],
      summary: 'Delivery status of a message',
      description: 'The sender sees every recipient; a recipient sees only its own row.',
      params: MessageParams,
      response: { 200: MessageStatusSchema, ...errorResponses(...AUTHENTICATED_ERRORS, 403, 404) }
    }
  }, async (req) => messageStatus(db, req.params.message, principalOf(req).address))

  app.post('/message/status', {
    schema: {
      operationId: 'reportMessageStatus',
      tags: ['messages'],
      summary: 'Report delivered or read',
      description: 'Recipients only. Status only moves forward; a report that is not ahead is a no-op (still 204). ' +
        'A change sends message.status to the sender.',
      body: ReportStatusBody,
      response: { 204: NoContent, ...errorResponses(...AUTHENTICATED_ERRORS, 403, 404) }
    }
  }, async (req, reply) => {
    await reportStatus(db, req.body.message, principalOf(req).address, req.body.status)
    return reply.code(204).send()
  })

  app.post('/message/typing', {
    schema: {
      operationId: 'startTyping',
      tags: ['messages'],
      summary: 'Say you are typing',
      description: 'Sends typing.started { from, to, expiresAt } (15 s later) to the recipient, or to each other member of a group. A user is told only if it knows the caller: a message between them either way, a group they share, or the caller in its roster; otherwise the call answers 204 and is dropped. A sender\'s typing reaches at most 1,000 feeds a second (5,000 at once, per instance): past that, 429 RATE_LIMITED with Retry-After.',
      body: TypingBody,
      response: { 204: NoContent, ...errorResponses(...AUTHENTICATED_ERRORS, 403, 404) }
    }
  }, async (req, reply) => {
    await typing.start(principalOf(req).address, req.body.recipient)
    return reply.code(204).send()
  })

  app.delete('/message/typing/:recipient', {
    schema: {
      operationId: 'stopTyping',
      tags: ['messages'],
      summary: 'Say you stopped typing',
      description: 'Sends typing.stopped { from, to }, to whom typing.started would go, within the same allowance of feeds.',
      params: TypingParams,
      response: { 204: NoContent, ...errorResponses(...AUTHENTICATED_ERRORS, 403, 404) }
    }
  }, async (req, reply) => {
    await typing.stop(principalOf(req).address, req.params.recipient)
    return reply.code(204).send()
  })

  app.get('/message/:message', {
    schema: {
      operationId: 'getMessage',
      tags: ['messages'],
      summary: 'Read a message',
      description: 'For its sender and its recipients; a recipient that deleted it for itself gets 404.',
      params: MessageParams,
      response: { 200: MessageSchema, ...errorResponses(...AUTHENTICATED_ERRORS, 403, 404) }
    }
  }, async (req) => {
    const viewer = principalOf(req).address
    const { row } = await readableMessage(messages, req.params.message, viewer)
    return messages.view(row, viewer)
  })

  app.patch('/message/:message', {
    // An edit writes the message once per recipient (a group's 999 copies of up to MAX_BODY_CHARS).
    config: { admission: 'heavy' },
    schema: {
      operationId: 'editMessage',
      tags: ['messages'],
      summary: 'Edit a message',
      description: 'Replaces the body (same limits as a send; counts no quota) and sets `editedAt`. Only its sender (403 for ' +
        'others, 404 when deleted or unknown), and only within MESSAGE_EDIT_WINDOW_SECONDS of sending (default 24 h; 403 ' +
        'after it). Every recipient that has not hidden it gets message.edited with the message as it now is; search finds ' +
        'the new text and no longer the old. One at a time per key (heavy admission). With Idempotency-Key (kept 24 h per API key), a repeat answers the message as it ' +
        'is (Idempotent-Replayed: true) and changes nothing; the same key with another body is 422 IDEMPOTENCY_MISMATCH.',
      params: MessageParams,
      headers: SendMessageHeaders,
      body: editMessageBody(maxBodyChars),
      response: { 200: EditedMessage, ...errorResponses(...AUTHENTICATED_ERRORS, 403, 404, 422) }
    }
  }, async (req, reply) => {
    const principal = principalOf(req)
    const result = await editMessage(db, {
      id: req.params.message,
      editor: principal.address,
      keyId: principal.keyId,
      body: req.body.body,
      windowSeconds: editWindowSeconds,
      idempotencyKey: req.headers['idempotency-key']
    })
    if (result.replayed) reply.header('idempotent-replayed', 'true')
    return result.message
  })

  /** PUT and DELETE /message/{id}/reactions/{emoji}: one description, `added` telling them apart. */
  const reactionRoute = (added: boolean) => ({
    config: { admission: 'heavy' as const },
    schema: {
      operationId: added ? 'addReaction' : 'removeReaction',
      tags: ['messages'],
      summary: added ? 'React to a message' : 'Take a reaction back',
      description: (added
        ? 'Adds the caller\'s reaction with `emoji` (1–32 characters, no whitespace or control characters); at most 20 ' +
          'different emoji per message (409 CONFLICT for a 21st). '
        : 'Removes the caller\'s reaction with `emoji`. ') +
        'Idempotent, for whoever may read the message; a change sends message.reaction to the message\'s sender and ' +
        'recipients, the caller aside. One at a time per key (heavy admission): a change in a large group is an event per member.',
      params: ReactionParams,
      response: { 204: NoContent, ...errorResponses(...AUTHENTICATED_ERRORS, 403, 404, ...(added ? [409] : [])) }
    }
  })

  app.put('/message/:message/reactions/:emoji', reactionRoute(true), async (req, reply) => {
    await react(db, req.log, req.params.message, principalOf(req).address, req.params.emoji, true)
    return reply.code(204).send()
  })

  app.delete('/message/:message/reactions/:emoji', reactionRoute(false), async (req, reply) => {
    await react(db, req.log, req.params.message, principalOf(req).address, req.params.emoji, false)
    return reply.code(204).send()
  })

  app.delete('/message/:message', {
    schema: {
      operationId: 'deleteMessage',
      tags: ['messages'],
      summary: 'Delete a message',
      description: 'By its sender: erased for everyone (body and attachments), with message.deleted to each recipient. ' +
        'By a recipient: hidden for that recipient only.',
      params: MessageParams,
      response: { 204: NoContent, ...errorResponses(...AUTHENTICATED_ERRORS, 403, 404) }
    }
  }, async (req, reply) => {
    await deleteMessage(db, req.params.message, principalOf(req).address)
    return reply.code(204).send()
  })

  app.get('/message/:message/attachment/:n', {
    config: { admission: 'transfer' },
    schema: {
      operationId: 'downloadAttachment',
      tags: ['messages'],
      summary: 'Download an attachment',
      description: 'The bytes as uploaded, with their Content-Type, streamed. Same access as the message. ' +
        'One `Range: bytes=…` answers 206 with Content-Range (416 past the end), unless If-Range is sent and is not the ' +
        'current ETag (a date never matches: there is no Last-Modified), which answers the whole file 200; If-None-Match ' +
        'with the ETag answers 304 with no body.',
      params: AttachmentParams,
      response: {
        ...AttachmentFile,
        304: Type.Unsafe<undefined>({ type: 'null', description: 'If-None-Match matched the ETag: no body, the ETag again' }),
        ...errorResponses(...AUTHENTICATED_ERRORS, 403, 404, 416)
      }
    }
  }, async (req, reply) => {
    const { message } = req.params
    const n = Number(req.params.n)
    await readableMessage(messages, message, principalOf(req).address)
    const file = await messages.attachment(message, n)
    if (file === undefined) throw new NotFound('attachment', `${n} of message ${message}`)
    const etag = attachmentEtag(file.sha256)
    reply
      .header('etag', etag)
      .header('accept-ranges', 'bytes')
      .header('content-disposition', contentDisposition(file.filename))
      .header('x-content-type-options', 'nosniff')
      .header('cache-control', 'private, no-store')
    const ifNoneMatch = req.headers['if-none-match']
    if (ifNoneMatch !== undefined && ifNoneMatch.split(',').some((tag) => [etag, `W/${etag}`, '*'].includes(tag.trim()))) {
      // No body at all: a `null` payload was serialized as JSON ("null", Content-Length: 4,
      // application/json), and a client reading the 304 waited for 4 bytes that never came.
      return reply.code(304).send()
    }
    // RFC 9110 §13.1.5: a Range is honoured only if If-Range (when sent) names the current
    // representation, by strong comparison with its ETag (we send no Last-Modified, so a date
    // never matches); otherwise the whole file, 200, so a client never splices new bytes into
    // an old copy.
    const ifRange = req.headers['if-range']
    const rangeHeader = ifRange === undefined || (typeof ifRange === 'string' && ifRange.trim() === etag) ? req.headers.range : undefined
    const range = parseRange(rangeHeader, file.size)
    if (range === 'unsatisfiable') {
      throw new AppError(416, 'RANGE_NOT_SATISFIABLE', `range: ${JSON.stringify(rangeHeader)} lies outside the attachment's ${file.size} bytes`,
        { 'content-range': `bytes */${file.size}` })
    }
    const { start, end } = range ?? { start: 0, end: file.size - 1 }
    if (range !== undefined) reply.code(206).header('content-range', `bytes ${start}-${end}/${file.size}`)
    reply.header('content-type', file.contentType).header('content-length', String(end - start + 1))
    if (file.size === 0) return reply.send(Buffer.alloc(0))
    // HEAD (Fastify's, from this route): the headers above and no byte of the file. Fastify
    // drains whatever stream a HEAD answers, so it gets an empty one, and keeps Content-Length.
    if (req.method === 'HEAD') return reply.send(Readable.from([]))
    return reply.send(Readable.from(streamChunks(store, file.uploadId, start, end), { objectMode: false }))
  })
}

/** Hex digits of an ETag: 128 bits of the keyed tag, as unguessable as the whole and half as long. */
const ETAG_HEX = 32

/**
 * A file's ETag: a keyed tag of its SHA-256, quoted. The plain hash was the ETag before; it
 * confirmed a guess of a file's content to anyone who saw the header (a proxy's log, a cache),
 * as a stored hash would the database's reader. Under the active key, so a rotation changes
 * every ETag once (a cache fetches the file again, and nothing worse).
 */
function attachmentEtag (sha256: string): string {
  return `"${keyring().tag(`etag:${sha256}`).slice(0, ETAG_HEX)}"`
}

/**
 * Bytes `start`..`end` of a stored file, a chunk per query as the client takes them
 * (Readable.from pulls on demand, so a slow reader holds neither memory nor a connection). Only
 * the chunks the range touches are read and opened: a sealed chunk opens only whole, and the
 * file's own sizes (CHUNK_BYTES each) place a byte, never the longer sealed rows.
 */
async function * streamChunks (store: AttachmentChunksRepository, uploadId: string, start: number, end: number): AsyncGenerator<Buffer> {
  const last = Math.floor(end / CHUNK_BYTES)
  for (let seq = Math.floor(start / CHUNK_BYTES); seq <= last; seq++) {
    const chunk = await store.readChunk(uploadId, seq)
    // The message was deleted mid-download: end the response short rather than send garbage.
    if (chunk === undefined) throw new Error(`attachment ${uploadId} lost chunk ${seq} mid-download`)
    const offset = seq * CHUNK_BYTES
    yield * piecesBetween(chunk, Math.max(0, start - offset), end - offset + 1)
    await giveTheLoopATurn()
  }
}
