import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import { Type } from 'typebox'
import type { Db } from '../../db/client.js'
import type { Metrics } from '../../metrics.js'
import { NotFound, ValidationFailed } from '../../errors.js'
import { principalOf } from '../../plugins/auth.js'
import { UploadedFile } from '../../plugins/uploads.js'
import { AUTHENTICATED_ERRORS, errorResponses, NoContent } from '../../schemas.js'
import { quotaHeaders } from '../quota/quota.repository.js'
import { contentDisposition } from './content-disposition.js'
import { deleteMessage } from './delete-message.js'
import { readableMessage } from './message-access.js'
import { createMessagesRepository } from './messages.repository.js'
import {
  AttachmentParams, MessageParams, MessageSchema, MessageStatusSchema, ReportStatusBody, SendMessageHeaders, sendMessageBody, TypingBody, TypingParams
} from './messages.schemas.js'
import { messageStatus, reportStatus } from './receipts.js'
import { sendMessage } from './send-message.js'
import { startTyping, stopTyping } from './typing.js'

export interface MessagesRoutesOptions {
  db: Db
  maxBodyChars: number
  metrics: Metrics
}

export const messagesRoutes: FastifyPluginAsyncTypebox<MessagesRoutesOptions> = async (app, { db, maxBodyChars, metrics }) => {
  const messages = createMessagesRepository(db)

  app.post('/message', {
    config: { acceptsFiles: true },
    schema: {
      tags: ['messages'],
      summary: 'Send a message',
      description: 'To a user address or a group id, as JSON, a form, or multipart/form-data with `attachment` file parts. ' +
        'Counts against the key\'s daily quota (X-Quota-* headers). With Idempotency-Key, a retry answers the original message.',
      consumes: ['application/json', 'application/x-www-form-urlencoded', 'multipart/form-data'],
      headers: SendMessageHeaders,
      body: sendMessageBody(maxBodyChars),
      response: { 200: MessageSchema, ...errorResponses(...AUTHENTICATED_ERRORS, 403, 404, 409, 413, 415, 422) }
    }
  }, async (req, reply) => {
    const principal = principalOf(req)
    const files = req.body.attachment ?? []
    if (!files.every((f) => f instanceof UploadedFile)) {
      throw new ValidationFailed('attachment: files are sent as multipart/form-data file parts')
    }
    const result = await sendMessage(db, {
      principal,
      recipient: req.body.recipient,
      body: req.body.body ?? '',
      files,
      idempotencyKey: req.headers['idempotency-key']
    })
    reply.headers(quotaHeaders(result.quota))
    if (result.replayed) reply.header('idempotent-replayed', 'true')
    else metrics.messageSent()
    return result.message
  })

  app.get('/message/:message/status', {
    schema: {
      tags: ['messages'],
      summary: 'Delivery status of a message',
      description: 'The sender sees every recipient; a recipient sees only its own row.',
      params: MessageParams,
      response: { 200: MessageStatusSchema, ...errorResponses(...AUTHENTICATED_ERRORS, 403, 404) }
    }
  }, async (req) => messageStatus(db, req.params.message, principalOf(req).address))

  app.post('/message/status', {
    schema: {
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
      tags: ['messages'],
      summary: 'Say you are typing',
      description: 'Sends typing.started { from, to, expiresAt } (15 s later) to the recipient, or to each other member of a group.',
      body: TypingBody,
      response: { 204: NoContent, ...errorResponses(...AUTHENTICATED_ERRORS, 403, 404) }
    }
  }, async (req, reply) => {
    await startTyping(db, principalOf(req).address, req.body.recipient)
    return reply.code(204).send()
  })

  app.delete('/message/typing/:recipient', {
    schema: {
      tags: ['messages'],
      summary: 'Say you stopped typing',
      description: 'Sends typing.stopped { from, to }.',
      params: TypingParams,
      response: { 204: NoContent, ...errorResponses(...AUTHENTICATED_ERRORS, 403, 404) }
    }
  }, async (req, reply) => {
    await stopTyping(db, principalOf(req).address, req.params.recipient)
    return reply.code(204).send()
  })

  app.get('/message/:message', {
    schema: {
      tags: ['messages'],
      summary: 'Read a message',
      description: 'For its sender and its recipients; a recipient that deleted it for itself gets 404.',
      params: MessageParams,
      response: { 200: MessageSchema, ...errorResponses(...AUTHENTICATED_ERRORS, 403, 404) }
    }
  }, async (req) => {
    const { row } = await readableMessage(messages, req.params.message, principalOf(req).address)
    return messages.view(row)
  })

  app.delete('/message/:message', {
    schema: {
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
    schema: {
      tags: ['messages'],
      summary: 'Download an attachment',
      description: 'The bytes as uploaded, with their Content-Type. Same access as the message.',
      params: AttachmentParams,
      response: {
        200: Type.Unsafe<Buffer>({ type: 'string', format: 'binary', description: 'The file, with its uploaded Content-Type' }),
        ...errorResponses(...AUTHENTICATED_ERRORS, 403, 404)
      }
    }
  }, async (req, reply) => {
    const { message, n } = req.params
    await readableMessage(messages, message, principalOf(req).address)
    const file = await messages.attachment(message, n)
    if (file === undefined) throw new NotFound('attachment', `${n} of message ${message}`)
    return reply
      .header('content-type', file.contentType)
      .header('content-length', String(file.data.length))
      .header('content-disposition', contentDisposition(file.filename))
      .header('x-content-type-options', 'nosniff')
      .header('cache-control', 'private, no-store')
      .send(file.data)
  })
}
