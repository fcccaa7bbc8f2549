import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import { setTimeout as sleep } from 'node:timers/promises'
import { Type } from 'typebox'
import { RateLimited, ValidationFailed } from '../../errors.js'
import { principalOf } from '../../plugins/auth.js'
import { AUTHENTICATED_ERRORS, errorResponses } from '../../schemas.js'
import { toEvent } from './events.repository.js'
import type { FeedReads } from './feed-reads.js'
import { CLIENT_GONE, type FeedWaiting } from './feed-waiting.js'
import { MAX_ANSWER_BYTES } from './events.routes.js'
import { EVENT_ID, EventId } from './events.schemas.js'

export interface EventStreamRoutesOptions {
  /** Reads of the feed, gathered with other connections' (shared with GET /events). */
  feedReads: FeedReads
  /** Waits on the feed, and their places per API key (streams and long-polls): shared with GET /events. */
  feed: FeedWaiting
  heartbeatMs: number
}

// One read at most this many events, and at most MAX_ANSWER_BYTES of them: a stream's memory is
// bounded by a page plus the socket buffer.
const PAGE = 100
// A wait without notification re-reads the feed anyway after this long (a lost NOTIFY).
const SAFETY_WAIT_MS = 30_000
/** A client that takes none of a written page for this long is cut off: what it pins is bounded in time too. */
const STALL_MS = 10_000
/** A read refused by a full gate queue is tried again after this long. */
const QUEUE_FULL_RETRY_MS = 250

const StreamQuery = Type.Object({
  after: Type.Optional(EventId({ description: 'Stream events with a greater id; the Last-Event-ID header wins' }))
})

export const eventStreamRoutes: FastifyPluginAsyncTypebox<EventStreamRoutesOptions> = async (app, { feedReads, feed, heartbeatMs }) => {
  app.get('/events/stream', {
    config: { admission: 'none' },
    schema: {
      operationId: 'streamEvents',
      tags: ['events'],
      summary: 'Stream the caller\'s events (Server-Sent Events)',
      description: 'text/event-stream: every unacknowledged event after the Last-Event-ID header (or ?after=), then each new one ' +
        'as it commits on any instance, as `id:` / `event:` / `data:` (the Event JSON). A comment line is sent at least every ' +
        '15 s. Acknowledges nothing; counted with the key\'s long-polls (MAX_LONG_POLLS_PER_KEY). The connection is closed ' +
        'within 5 s of the key being revoked or expiring, or its user deactivated, and when the client takes nothing for 10 s.',
      querystring: StreamQuery,
      response: {
        200: Type.String({ description: 'An endless text/event-stream' }),
        ...errorResponses(...AUTHENTICATED_ERRORS)
      }
    }
  }, async (req, reply) => {
    const { address: me, keyId } = principalOf(req)
    const header = req.headers['last-event-id']
    if (header !== undefined && (typeof header !== 'string' || !EVENT_ID.test(header.trim()))) {
      throw new ValidationFailed('Last-Event-ID header must be an event id (a decimal string)')
    }
    let after = Number(header?.trim() ?? req.query.after ?? '0')
    // The per-key place is given back the moment the connection closes, not when the loop
    // notices: a client reconnecting at once must find it free.
    const uncount = feed.hold(keyId)
    if (uncount === undefined) throw new RateLimited()

    reply.hijack()
    const res = reply.raw
    let open = true
    const gone = new AbortController()
    const closed = () => {
      open = false
      gone.abort(CLIENT_GONE)
      uncount()
    }
    res.once('close', closed)
    // Gone before the stream began: its close has already been and will not come again.
    if (res.destroyed || req.raw.socket.destroyed) closed()

    res.writeHead(200, {
      ...(reply.getHeaders() as Record<string, string>),
      'content-type': 'text/event-stream; charset=utf-8',
      'cache-control': 'no-cache, no-transform',
      'x-accel-buffering': 'no'
    })
    res.write(': stream open\n\n')

    // Only onto an empty buffer: a client that is not reading gets nothing more piled up, and
    // one that has left something untaken for STALL_MS (seen at a heartbeat) is cut off, as a
    // page's wait for drain does.
    let stalledSince: number | undefined
    const heartbeat = setInterval(() => {
      if (!open) return
      if (res.writableLength === 0) {
        stalledSince = undefined
        res.write(': heartbeat\n\n')
        return
      }
      stalledSince ??= Date.now()
      if (Date.now() - stalledSince >= STALL_MS) {
        req.log.info({ keyId, buffered: res.writableLength }, 'event stream closed: its client took nothing for STALL_MS')
        res.destroy()
      }
    }, heartbeatMs)
    // Waits for the socket to take what was written, so a slow reader holds one page, not the
    // feed; a reader that takes nothing for STALL_MS is cut off (it resumes with Last-Event-ID).
    // A connection already gone emits neither again: waiting on it would hold this loop, and its
    // heartbeat timer, for ever (it kept a test process alive until tap's 300 s timeout).
    const drained = () => new Promise<void>((resolve) => {
      if (!open || res.destroyed || res.writableEnded) return resolve()
      const stalled = setTimeout(() => {
        req.log.info({ keyId, buffered: res.writableLength }, 'event stream closed: its client took nothing for STALL_MS')
        res.destroy()
      }, STALL_MS)
      const done = () => { clearTimeout(stalled); res.off('drain', done); res.off('close', done); resolve() }
      res.once('drain', done)
      res.once('close', done)
    })

    // A read takes a place at the key's request gate; a gate whose queue is full (the key's own
    // backlog) delays the stream rather than ending it. Undefined once the connection is gone.
    const admitted = async (): Promise<(() => void) | undefined> => {
      while (open) {
        try {
          return await app.admit(req, reply, 'request')
        } catch (err) {
          if (!(err instanceof RateLimited)) throw err
          await sleep(QUEUE_FULL_RETRY_MS)
        }
      }
      return undefined
    }

    const read = async () => {
      const leave = await admitted()
      if (leave === undefined) return undefined
      // The read carries the key's check (the same statement), so nothing committed after a
      // revocation goes out, however fresh the authenticator's cache thought the key; the
      // key watch then closes the stream.
      const rows = await feedReads.page({ address: me, after, limit: PAGE, maxBytes: MAX_ANSWER_BYTES, keyId }).finally(leave)
      return rows.length > 0 ? rows : undefined
    }

    try {
      const pages = feed.follow(me, {
        read,
        safetyMs: SAFETY_WAIT_MS,
        signal: gone.signal,
        // A key revoked, expired or stripped of read, or its user deactivated, ends the stream
        // within KEY_WATCH_MS on any instance: the connection is closed, what it had not yet taken dropped.
        keyId,
        refused: () => {
          req.log.info({ keyId }, 'event stream closed: its key is no longer accepted')
          res.destroy()
        }
      })
      for await (const rows of pages) {
        let chunk = ''
        for (const row of rows) {
          const event = toEvent(row)
          chunk += `id: ${event.id}\nevent: ${event.type}\ndata: ${JSON.stringify(event)}\n\n`
        }
        after = rows.at(-1)!.seq
        if (open && !res.write(chunk)) await drained()
      }
    } catch (err) {
      // Headers are sent: the stream just ends, and the client reconnects with Last-Event-ID.
      req.log.warn({ err: { message: (err as Error).message } }, 'event stream ended by an error')
    } finally {
      clearInterval(heartbeat)
      uncount()
      // On shutdown the connection goes too, so it does not hold the server open.
      if (feed.closing) res.shouldKeepAlive = false
      res.end()
    }
  })
}
