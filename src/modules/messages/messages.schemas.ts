import { Type, type Static } from 'typebox'
import { MESSAGE_ID_PATTERN } from '../../ids.js'
import { Timestamp, withHeaders } from '../../schemas.js'
import type { Readable } from 'node:stream'
import type { UploadedFile } from './uploaded-file.js'

const AttachmentSchema = Type.Object({
  index: Type.Integer({ minimum: 1, description: 'Position from 1: GET /v2/message/{id}/attachment/{index}' }),
  filename: Type.String(),
  contentType: Type.String(),
  size: Type.Integer({ description: 'Bytes' })
})

const ReactionSchema = Type.Object({
  emoji: Type.String(),
  count: Type.Integer({ minimum: 1, description: 'How many users reacted with it' }),
  mine: Type.Boolean({ description: 'Whether the reader is one of them' })
}, { title: 'Reaction' })

export const MessageSchema = Type.Object({
  id: Type.String({ description: 'msg_…' }),
  sender: Type.String({ description: 'Address of the sender' }),
  recipient: Type.String({ description: 'A user address, or a group id (grp_…)' }),
  body: Type.String(),
  attachments: Type.Array(AttachmentSchema),
  createdAt: Timestamp,
  editedAt: Type.Union([Timestamp, Type.Null()], { description: 'When the body was last edited; null until then' }),
  replyTo: Type.Union([Type.String(), Type.Null()], { description: 'The message of the same conversation this one answers (it may have been deleted since), or null' }),
  reactions: Type.Array(ReactionSchema, { description: 'Each emoji reacted with, most used first (then first used first); [] when none' })
}, { title: 'Message' })

export type Message = Static<typeof MessageSchema>

/**
 * An emoji as a reaction: 1–32 characters (code points: a flag or a family joined by U+200D is
 * several), none of them whitespace or a control character.
 */
export const REACTION_EMOJI = /^[^\p{White_Space}\p{Cc}]{1,32}$/u

export const ReactionParams = Type.Object({
  message: Type.String({ pattern: MESSAGE_ID_PATTERN, description: 'A message id (msg_…)' }),
  emoji: Type.String({ minLength: 1, maxLength: 64, description: '1–32 characters, no whitespace or control characters (URL-encoded)' })
})

export const MessageParams = Type.Object({
  message: Type.String({ pattern: MESSAGE_ID_PATTERN, description: 'A message id (msg_…)' })
})

export const AttachmentParams = Type.Object({
  message: Type.String({ pattern: MESSAGE_ID_PATTERN, description: 'A message id (msg_…)' }),
  // A string of canonical digits, not an integer: Ajv would coerce `01`, `1e0`, ` 1` and `+1`
  // to 1, giving one file many URLs (and caches many keys). Anything else answers 400.
  n: Type.String({ pattern: '^[1-9][0-9]{0,3}$', description: 'Attachment position, from 1, in canonical digits (no sign, no leading zero)' })
})

/** The send's fields, one schema for JSON, form and multipart bodies. */
export function sendMessageBody (maxBodyChars: number) {
  return Type.Object({
    recipient: Type.String({ minLength: 1, maxLength: 100, description: 'A user address or a group id (grp_…)' }),
    body: Type.Optional(Type.String({ maxLength: maxBodyChars, description: 'Text; may be empty only with an attachment' })),
    replyTo: Type.Optional(Type.String({ pattern: MESSAGE_ID_PATTERN, description: 'A message of the same conversation, which the sender may read, that this one answers' })),
    attachment: Type.Optional(Type.Array(
      Type.Unsafe<UploadedFile>({ type: 'object', description: 'A file part (multipart/form-data only), with its own Content-Type' }),
      { description: 'Repeat the part for several files' }
    ))
  })
}

/**
 * The send's body as a client writes it, for the OpenAPI document (the route's swaggerTransform):
 * per content type, a file part as bytes, and only multipart carries one.
 */
export function sendMessageWireBody (maxBodyChars: number) {
  const { attachment: _parsed, ...fields } = sendMessageBody(maxBodyChars).properties
  const files = Type.Array(Type.String({ format: 'binary' }), { description: 'One file part per attachment, each with its own Content-Type' })
  return {
    content: {
      'application/json': { schema: Type.Object(fields) },
      'application/x-www-form-urlencoded': { schema: Type.Object(fields) },
      'multipart/form-data': { schema: Type.Object({ ...fields, attachment: Type.Optional(files) }) }
    }
  }
}

/** The daily quota, on a send's answer and on its 429 (quota.repository.ts quotaHeaders). */
const QuotaHeaders = {
  'X-Quota-Limit': Type.Integer({ title: 'QuotaLimit', description: 'Messages this key may send per UTC day' }),
  'X-Quota-Remaining': Type.Integer({ title: 'QuotaRemaining', description: 'Messages left today' }),
  'X-Quota-Reset': Type.Integer({ title: 'QuotaReset', description: 'Epoch seconds of the next UTC midnight, when the quota refills' })
}

/** A send's answer: the message, with the quota's headers, and Idempotent-Replayed on a replay. */
export const SentMessage = withHeaders(MessageSchema, {
  ...QuotaHeaders,
  'Idempotent-Replayed': Type.String({ title: 'IdempotentReplayed', description: '"true" when this answers an earlier send with the same Idempotency-Key' })
})

/** An edit's body: the new text, as long as a send's may be. */
export function editMessageBody (maxBodyChars: number) {
  return Type.Object({
    body: Type.String({ maxLength: maxBodyChars, description: 'The new text; may be empty only when the message has an attachment' })
  })
}

/** An edit's answer: the message as it now is, with Idempotent-Replayed on a replay. */
export const EditedMessage = withHeaders(MessageSchema, {
  'Idempotent-Replayed': Type.String({ title: 'IdempotentReplayed', description: '"true" when this answers an earlier edit with the same Idempotency-Key' })
})

/** A send's 429: the error, with the quota's headers (QUOTA_EXCEEDED sets them). */
export const SendRefused = withHeaders(Type.Ref('Error'), QuotaHeaders)

const Bytes = Type.Unsafe<Buffer | Readable>({ type: 'string', format: 'binary' })
const FileHeaders = {
  ETag: Type.String({ title: 'ETag', description: 'A keyed tag of the file\'s content, quoted: the same file has the same ETag, and it tells nothing about the content' }),
  'Content-Disposition': Type.String({ title: 'ContentDisposition', description: 'attachment, with the filename in an ASCII-safe and an RFC 5987 form' })
}

/** An attachment's bytes as uploaded, in their own type: not JSON. */
export const AttachmentFile = {
  200: withHeaders(Type.Unsafe<Buffer | Readable>({
    description: 'The file, with its uploaded Content-Type; ETag is a quoted keyed tag of its content',
    content: { 'application/octet-stream': { schema: Bytes } }
  }), FileHeaders),
  206: withHeaders(Type.Unsafe<Buffer | Readable>({
    description: 'The one byte range asked for with Range, with Content-Range',
    content: { 'application/octet-stream': { schema: Bytes } }
  }), {
    ...FileHeaders,
    'Content-Range': Type.String({ title: 'ContentRange', description: 'bytes first-last/size of a partial answer, or bytes */size with 416' })
  })
}

export const SendMessageHeaders = Type.Object({
  'idempotency-key': Type.Optional(Type.String({
    minLength: 1,
    maxLength: 255,
    pattern: '^[\\x20-\\x7E]+$',
    description: 'Makes retries safe: a repeat within 24 h answers the original message'
  }))
})

export const MessageStatusSchema = Type.Object({
  message: Type.String(),
  recipients: Type.Array(Type.Object({
    address: Type.String(),
    status: Type.Union([Type.Literal('sent'), Type.Literal('delivered'), Type.Literal('read')]),
    updatedAt: Timestamp
  }))
}, { title: 'MessageStatus' })

export type MessageStatus = Static<typeof MessageStatusSchema>

export const ReportStatusBody = Type.Object({
  message: Type.String({ pattern: MESSAGE_ID_PATTERN, description: 'A message id (msg_…)' }),
  status: Type.Union([Type.Literal('delivered'), Type.Literal('read')], { description: 'delivered or read; read implies delivered' })
})

const Recipient = Type.String({ minLength: 1, maxLength: 100, description: 'A user address or a group id (grp_…)' })

export const TypingBody = Type.Object({ recipient: Recipient })

export const TypingParams = Type.Object({ recipient: Recipient })
