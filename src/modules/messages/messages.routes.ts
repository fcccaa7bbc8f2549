import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import { Type } from 'typebox'
import type { Db } from '../../db/client.js'
import { NotFound, ValidationFailed } from '../../errors.js'
import { principalOf } from '../../plugins/auth.js'
import { UploadedFile } from '../../plugins/uploads.js'
import { AUTHENTICATED_ERRORS, errorResponses, NoContent } from '../../schemas.js'
import { quotaHeaders } from '../quota/quota.repository.js'
import { contentDisposition } from './content-disposition.js'
import { deleteMessage } from './delete-message.js'
import { readableMessage } from './message-access.js'
import { createMessagesRepository } from './messages.repository.js'
import { AttachmentParams, MessageParams, MessageSchema, SendMessageHeaders, sendMessageBody } from './messages.schemas.js'
import { sendMessage } from './send-message.js'

export interface MessagesRoutesOptions {
  db: Db
  maxBodyChars: number
}

export const messagesRoutes: FastifyPluginAsyncTypebox<MessagesRoutesOptions> = async (app, { db, maxBodyChars }) => {
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
    return result.message
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
