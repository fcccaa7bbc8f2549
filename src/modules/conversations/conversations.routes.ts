import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import { decodeTimeCursor, encodeTimeCursor } from '../../cursors.js'
import type { Db } from '../../db/client.js'
import type { Reads } from '../../db/replica.js'
import { isMessageId } from '../../ids.js'
import { pageBudget } from '../../page-budget.js'
import { principalOf } from '../../plugins/auth.js'
import { arrivalOf } from '../../plugins/read-replica.js'
import { AUTHENTICATED_ERRORS, errorResponses, NoContent } from '../../schemas.js'
import { createMessagesRepository } from '../messages/messages.repository.js'
import { createConversationsRepository, toConversation, type ConversationsAfter } from './conversations.repository.js'
import { ConversationList, ConversationParams, HistoryPageSchema, HistoryQuery, ListConversationsQuery, ReadUpToBody } from './conversations.schemas.js'
import { conversationPeer, deliveredSince, readConversation } from './conversations.service.js'

function encodeCursor (after: ConversationsAfter): string {
  return encodeTimeCursor({ at: after.createdAt, id: after.id })
}

/** Only what encodeCursor wrote: a time it could have written (isCursorTime) and a message id; anything else is a 400. */
function decodeCursor (text: string): ConversationsAfter {
  const { at, id } = decodeTimeCursor(text, isMessageId)
  return { createdAt: at, id }
}

/** The reads are served by the read replica when there is one and it has caught up (src/db/replica.ts). */
export const conversationsRoutes: FastifyPluginAsyncTypebox<{ db: Db, reads: Reads }> = async (app, { db, reads }) => {
  app.get('/conversations', {
    config: { admission: 'heavy' },
    schema: {
      operationId: 'listConversations',
      tags: ['messages'],
      summary: 'The caller\'s conversations',
      description: 'Every 1:1 peer and group the caller has messages with (a group only while the caller is a member), ' +
        'each with its newest message the caller may read and how many messages from others the caller has not read; ' +
        'newest first, cursor-paged: a page holds at most `limit` of them and about 1 MiB (at least one).',
      querystring: ListConversationsQuery,
      response: { 200: ConversationList, ...errorResponses(...AUTHENTICATED_ERRORS) }
    }
  }, async (req, reply) => {
    const viewer = principalOf(req).address
    const limit = req.query.limit ?? 50
    const after = req.query.cursor === undefined ? undefined : decodeCursor(req.query.cursor)
    const { rows, views } = await reads.run(async (db) => {
      const rows = await createConversationsRepository(db).list(viewer, after, limit + 1)
      return { rows, views: await createMessagesRepository(db).viewMany(rows.slice(0, limit).map((r) => r.last), viewer) }
    }, { arrivedAt: arrivalOf(reply) })
    // At most MAX_PAGE_BYTES of them: past it the page ends early, with a cursor.
    const fits = pageBudget()
    const all = views.map((view, i) => toConversation(rows[i]!, view))
    const shown = all.findIndex((c) => !fits(c))
    const page = shown < 0 ? all : all.slice(0, shown)
    const last = rows[page.length - 1]
    return {
      conversations: page,
      nextCursor: rows.length > page.length && last !== undefined
        ? encodeCursor({ createdAt: last.last.createdAt.toISOString(), id: last.last.id })
        : null
    }
  })

  app.get('/conversations/:peer/messages', {
    schema: {
      operationId: 'conversationHistory',
      tags: ['messages'],
      summary: 'A conversation\'s messages, paged either way',
      description: 'The messages of the 1:1 conversation with user `peer`, or of group `peer`, that the caller may read ' +
        '(sent by it, or delivered to it and not hidden by it), in message-id order: `dir=back` newest first before `from` ' +
        '(or from the newest), `dir=forward` oldest first after `from`. A page holds at most `limit` messages and about ' +
        '1 MiB (at least one); its cost follows the page, not the conversation\'s length. A group\'s history is for its members.',
      params: ConversationParams,
      querystring: HistoryQuery,
      response: { 200: HistoryPageSchema, ...errorResponses(...AUTHENTICATED_ERRORS, 403, 404) }
    }
  }, async (req, reply) => {
    const viewer = principalOf(req).address
    const limit = req.query.limit ?? 50
    const page = { from: req.query.from, dir: req.query.dir ?? 'back', limit: limit + 1 }
    const { rows, views } = await reads.run(async (db) => {
      const peer = await conversationPeer(db, viewer, req.params.peer)
      const since = await deliveredSince(db, viewer, peer)
      const rows = await createConversationsRepository(db).history(viewer, peer, { ...page, since })
      return { rows, views: await createMessagesRepository(db).viewMany(rows.slice(0, limit), viewer) }
    }, { arrivedAt: arrivalOf(reply) })
    const fits = pageBudget()
    const shown = views.findIndex((m) => !fits(m))
    const messages = shown < 0 ? views : views.slice(0, shown)
    return { messages, next: rows.length > messages.length ? messages[messages.length - 1]!.id : null }
  })

  app.post('/conversations/:peer/read', {
    schema: {
      operationId: 'readConversation',
      tags: ['messages'],
      summary: 'Mark a conversation read up to a message',
      description: 'Every message from others in the conversation with `peer`, up to and including `upTo` in message-id order, ' +
        'becomes read for the caller (forward only, as POST /message/status), in one statement; the conversation\'s `unread` ' +
        'counts none of them. Each sender affected gets one conversation.read event, not one per message.',
      params: ConversationParams,
      body: ReadUpToBody,
      response: { 204: NoContent, ...errorResponses(...AUTHENTICATED_ERRORS, 403, 404) }
    }
  }, async (req, reply) => {
    await readConversation(db, principalOf(req).address, req.params.peer, req.body.upTo)
    return reply.code(204).send()
  })
}
