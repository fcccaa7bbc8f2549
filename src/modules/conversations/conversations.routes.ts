import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import type { Db } from '../../db/client.js'
import { decodeTimeCursor, encodeTimeCursor } from '../../cursors.js'
import { isMessageId } from '../../ids.js'
import { principalOf } from '../../plugins/auth.js'
import { AUTHENTICATED_ERRORS, errorResponses } from '../../schemas.js'
import { createMessagesRepository } from '../messages/messages.repository.js'
import { createConversationsRepository, toConversation, type ConversationsAfter } from './conversations.repository.js'
import { ConversationList, ListConversationsQuery } from './conversations.schemas.js'

function encodeCursor (after: ConversationsAfter): string {
  return encodeTimeCursor({ at: after.createdAt, id: after.id })
}

/** Only what encodeCursor wrote: a time it could have written (isCursorTime) and a message id; anything else is a 400. */
function decodeCursor (text: string): ConversationsAfter {
  const { at, id } = decodeTimeCursor(text, isMessageId)
  return { createdAt: at, id }
}

export const conversationsRoutes: FastifyPluginAsyncTypebox<{ db: Db }> = async (app, { db }) => {
  const conversations = createConversationsRepository(db)
  const messages = createMessagesRepository(db)

  app.get('/conversations', {
    config: { admission: 'heavy' },
    schema: {
      tags: ['messages'],
      summary: 'The caller\'s conversations',
      description: 'Every 1:1 peer and group the caller has messages with (a group only while the caller is a member), ' +
        'each with its newest message the caller may read and how many messages from others the caller has not read; ' +
        'newest first, cursor-paged.',
      querystring: ListConversationsQuery,
      response: { 200: ConversationList, ...errorResponses(...AUTHENTICATED_ERRORS) }
    }
  }, async (req) => {
    const viewer = principalOf(req).address
    const limit = req.query.limit ?? 50
    const after = req.query.cursor === undefined ? undefined : decodeCursor(req.query.cursor)
    const rows = await conversations.list(viewer, after, limit + 1)
    const page = rows.slice(0, limit)
    const views = await messages.viewMany(page.map((r) => r.last))
    const last = page.at(-1)
    return {
      conversations: page.map((r, i) => toConversation(r, views[i]!)),
      nextCursor: rows.length > limit && last !== undefined
        ? encodeCursor({ createdAt: last.last.createdAt.toISOString(), id: last.last.id })
        : null
    }
  })
}
