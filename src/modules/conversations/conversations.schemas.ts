import { Type, type Static } from 'typebox'
import { MESSAGE_ID_PATTERN } from '../../ids.js'
import { MessageSchema } from '../messages/messages.schemas.js'

const ConversationSchema = Type.Object({
  peer: Type.String({ description: 'The other user\'s address, or the group id (grp_…)' }),
  type: Type.Union([Type.Literal('user'), Type.Literal('group')]),
  lastMessage: MessageSchema,
  unread: Type.Integer({ minimum: 0, description: 'Messages from others in it whose status for the caller is not read' })
}, { title: 'Conversation' })

export type Conversation = Static<typeof ConversationSchema>

export const ConversationList = Type.Object({
  conversations: Type.Array(ConversationSchema),
  nextCursor: Type.Union([Type.String(), Type.Null()], { description: 'Pass as cursor for the next page; null on the last' })
}, { title: 'ConversationList' })

export const ListConversationsQuery = Type.Object({
  limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 200, default: 50 })),
  cursor: Type.Optional(Type.String({ minLength: 1, maxLength: 200, description: 'nextCursor of the previous page' }))
}, { additionalProperties: false })

export const ConversationParams = Type.Object({
  peer: Type.String({ minLength: 1, maxLength: 100, description: 'The other user\'s address, or a group id (grp_…)' })
})

export const HistoryQuery = Type.Object({
  from: Type.Optional(Type.String({ pattern: MESSAGE_ID_PATTERN, description: 'Start after this message in the page\'s direction (it need not exist any more): pass the previous page\'s `next`' })),
  dir: Type.Optional(Type.Union([Type.Literal('back'), Type.Literal('forward')], { default: 'back', description: 'back: newest first, before `from` (or from the newest); forward: oldest first, after `from`' })),
  limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 200, default: 50 }))
}, { additionalProperties: false })

export const HistoryPageSchema = Type.Object({
  messages: Type.Array(MessageSchema),
  next: Type.Union([Type.String(), Type.Null()], { description: 'The `from` of the following page in the same direction; null at the end' })
}, { title: 'HistoryPage' })

export const ReadUpToBody = Type.Object({
  upTo: Type.String({ pattern: MESSAGE_ID_PATTERN, description: 'A message of this conversation the caller may read: it and every earlier message from others become read' })
})
