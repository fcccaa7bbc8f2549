import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import type { Db } from '../../db/client.js'
import type { Reads } from '../../db/replica.js'
import type { Metrics } from '../../metrics.js'
import { RateLimited, Unauthorized, ValidationFailed } from '../../errors.js'
import { principalOf } from '../../plugins/auth.js'
import { arrivalOf } from '../../plugins/read-replica.js'
import { AUTHENTICATED_ERRORS, errorResponses, NoContent } from '../../schemas.js'
import { createEventsRepository, toEvent } from './events.repository.js'
import type { FeedReads } from './feed-reads.js'
import { CLIENT_GONE, type FeedWaiting } from './feed-waiting.js'
import { AcknowledgeEventsBody, DeleteEventsQuery, EventList, ListEventsQuery } from './events.schemas.js'

/**
 * The most one answer of GET /events or one page of an event stream holds: fewer events when
 * they are large (at least one), `last` saying where to resume. What a client that does not
 * read keeps the server holding per connection (docs/security.md).
 */
export const MAX_ANSWER_BYTES = 256 * 1024

const REFUSED_WHILE_WAITING = 'This API key was revoked or expired, lost its read scope, or its user was deactivated, while the request waited'

export interface EventsRoutesOptions {
  db: Db
  /** Where a read without `wait` may go: the read replica when it has caught up (see below). */
  reads?: Reads
  metrics: Metrics
  /** Waits on the feed, and their places per API key: shared with GET /events/stream. */
  feed: FeedWaiting
  /** Reads of the feed on the primary, gathered with other connections' (shared with GET /events/stream). */
  feedReads: FeedReads
}

export const eventsRoutes: FastifyPluginAsyncTypebox<EventsRoutesOptions> = async (app, { db, reads, metrics, feed, feedReads }) => {
  const events = createEventsRepository(db)
  let waiting = 0
  metrics.gauge('parley_long_polls_open', 'GET /v2/events requests holding a waiting place: waiting for an event, or reading the feed between waits', () => [{ value: waiting }])

  app.get('/events', {
    config: { admission: 'none' },
    schema: {
      operationId: 'listEvents',
      tags: ['events'],
      summary: 'Read the caller\'s events feed',
      description: 'Unacknowledged events with id > after, oldest first: at most limit, and at most 256 KiB of them (at least one ' +
        'event), so an answer shorter than limit may leave more to read. With wait, an empty answer is held until an event ' +
        'arrives (from any instance) or wait seconds pass. Following after = last never skips an event. A key may hold ' +
        'MAX_LONG_POLLS_PER_KEY (default 10) waiting requests and event streams at once; past that, 429 RATE_LIMITED. A wait ' +
        'whose key is revoked or expires, or whose user is deactivated, answers 401 within 5 s, never with events written after.',
      querystring: ListEventsQuery,
      response: { 200: EventList, ...errorResponses(...AUTHENTICATED_ERRORS) }
    }
  }, async (req, reply) => {
    const { address: me, keyId } = principalOf(req)
    const after = Number(req.query.after ?? '0')
    const limit = req.query.limit ?? 100
    const deadline = Date.now() + (req.query.wait ?? 0) * 1000
    const res = reply.raw
    // Each read takes one of the key's places at the request gate, like any database request,
    // and gives it back once read: the wait holds none, and neither does an answer its client is
    // slow to take (what that pins is bounded by MAX_ANSWER_BYTES instead).
    const read = async (mayLag = false) => {
      const leave = await app.admit(req, reply, 'request')
      try {
        // Carries the key's check: once it is revoked (or expired, or its user deactivated),
        // the read finds nothing, and the key watch answers the wait 401.
        if (mayLag && reads !== undefined) {
          return await reads.run((replica) => createEventsRepository(replica).page(me, after, limit, MAX_ANSWER_BYTES, keyId), { arrivedAt: arrivalOf(reply) })
        }
        return await feedReads.page({ address: me, after, limit, maxBytes: MAX_ANSWER_BYTES, keyId })
      } finally {
        leave()
      }
    }
    // A read without `wait` may be served by the read replica. It skips nothing: the replica
    // serves it only once it has replayed the primary as of the request's arrival (every
    // event committed before it, and every acknowledgement the caller was answered), and a
    // feed's events commit in id order (takeFeedIds holds the feed's row to commit) and so
    // replay in id order, so what it sees of a feed is always a prefix, and `last` never passes
    // an event still to come. A waiting read stays on the primary: it is woken by a NOTIFY as
    // soon as an event has committed, and on the replica would then wait for replay as well.
    let rows = await read(req.query.wait === undefined || req.query.wait === 0)
    if (rows.length === 0 && Date.now() < deadline && !feed.closing && !res.closed) {
      // Each waiting poll holds a socket and a timer: cap them per key, so one key cannot hoard the process.
      const giveBack = feed.hold(keyId)
      if (giveBack === undefined) {
        // Refused only if the feed is still empty: an event committed since the first read is
        // answered, as a poll with a place would answer it.
        rows = await read()
        // The contract's exact RATE_LIMITED text (API.md §2); the cap itself is in the OpenAPI description.
        if (rows.length === 0) throw new RateLimited()
      } else {
        // The client going away, or the key being revoked, expiring or its user deactivated
        // (noticed within KEY_WATCH_MS on any instance), ends the wait at once, and with it
        // the per-key place: the response's close, not the request's, which fires once its
        // (empty) body is read.
        const gone = new AbortController()
        const leave = () => gone.abort(CLIENT_GONE)
        res.once('close', leave)
        let refused = false
        const pages = feed.follow(me, {
          read: async () => {
            const found = await read()
            return found.length > 0 ? found : undefined
          },
          until: deadline,
          signal: gone.signal,
          keyId,
          refused: () => { refused = true }
        })
        waiting++
        try {
          // The first page found answers; following ends with it.
          const first = await pages.next()
          if (first.done !== true) rows = first.value
        } finally {
          await pages.return()
          waiting--
          res.off('close', leave)
          giveBack()
        }
        if (rows.length === 0 && refused) throw new Unauthorized(REFUSED_WHILE_WAITING)
      }
    }
    const list = rows.map(toEvent)
    // Each event as stored, not through the union's serializer: that would test every event
    // against each type in turn (about 6x the cost) and answer 500 for a whole feed holding
    // one event written before its type's schema last changed (events live up to 30 days).
    return reply.serializer(JSON.stringify).send({ events: list, last: list.at(-1)?.id ?? String(after) })
  })

  app.post('/events/ack', {
    schema: {
      operationId: 'acknowledgeEvents',
      tags: ['events'],
      summary: 'Acknowledge events',
      description: 'By ids, or every id up to upTo, for the calling API key only: the user\'s other keys still receive them. ' +
        'Events acknowledged are no longer returned to this key; ids not the caller\'s are ignored. An event is purged once every ' +
        'active key of its user has acknowledged it (and its webhooks have sent it), or after 30 days.',
      body: AcknowledgeEventsBody,
      response: { 204: NoContent, ...errorResponses(...AUTHENTICATED_ERRORS) }
    }
  }, async (req, reply) => {
    const { ids, upTo } = req.body
    if ((ids === undefined || ids.length === 0) && upTo === undefined) {
      throw new ValidationFailed('body: give ids (a list of event ids) or upTo (an event id)')
    }
    const { address, keyId } = principalOf(req)
    await events.acknowledge(address, keyId, (ids ?? []).map(Number), upTo === undefined ? undefined : Number(upTo))
    return reply.code(204).send()
  })

  app.delete('/events', {
    schema: {
      operationId: 'deleteEvents',
      tags: ['events'],
      summary: 'Delete events',
      description: 'Removes the caller\'s events from this API key\'s feed: all of them, or those with id up to upTo (the ' +
        'user\'s other keys keep them); the events themselves go once every active key has acknowledged them.',
      querystring: DeleteEventsQuery,
      response: { 204: NoContent, ...errorResponses(...AUTHENTICATED_ERRORS) }
    }
  }, async (req, reply) => {
    const upTo = req.query.upTo
    const { address, keyId } = principalOf(req)
    await events.remove(address, keyId, upTo === undefined ? undefined : Number(upTo))
    return reply.code(204).send()
  })
}
