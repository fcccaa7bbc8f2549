import { Type, type Static } from 'typebox'
import { MESSAGE_ID_PATTERN } from '../../ids.js'
import { Timestamp } from '../../schemas.js'
import type { UploadedFile } from '../../plugins/uploads.js'

const AttachmentSchema = Type.Object({
  index: Type.Integer({ minimum: 1, description: 'Position from 1: GET /v2/message/{id}/attachment/{index}' }),
  filename: Type.String(),
  contentType: Type.String(),
  size: Type.Integer({ description: 'Bytes' })
})

export const MessageSchema = Type.Object({
  id: Type.String({ description: 'msg_…' }),
  sender: Type.String({ description: 'Address of the sender' }),
  recipient: Type.String({ description: 'A user address, or a group id (grp_…)' }),
  body: Type.String(),
  attachments: Type.Array(AttachmentSchema),
  createdAt: Timestamp
}, { title: 'Message' })

export type Message = Static<typeof MessageSchema>

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
    attachment: Type.Optional(Type.Array(
      Type.Unsafe<UploadedFile>({ type: 'object', description: 'A file part (multipart/form-data only), with its own Content-Type' }),
      { description: 'Repeat the part for several files' }
    ))
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
