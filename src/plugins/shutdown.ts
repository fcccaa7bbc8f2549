import type { Socket } from 'node:net'
import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'

/**
 * Closes, at shutdown, every connection that carries no request. Node's closeIdleConnections()
 * skips a connection that has not sent a request yet (it counts as waiting for headers): HTTP
 * clients open such spare connections (undici does beside a long-poll), and each one held
 * close() until its socket timed out, 65 s later. A connection in the middle of a request is
 * left to finish, for up to DRAIN_MS; its answer carries `Connection: close`, and once it is
 * done the connection goes too. An answer whose headers went out before shutdown (an event stream's) cannot say
 * so, and Node looks for idle connections only when close() begins: a stream still reading
 * its feed then kept close() waiting for its kept-alive socket to time out, 70 s.
 */
function closeQuietConnectionsOnShutdown (app: FastifyInstance): void {
  const inFlight = new Map<Socket, number>()
  let closing = false
  app.server.on('connection', (socket: Socket) => {
    inFlight.set(socket, 0)
    socket.once('close', () => inFlight.delete(socket))
  })
  app.server.on('request', (req, res) => {
    const socket = req.socket
    inFlight.set(socket, (inFlight.get(socket) ?? 0) + 1)
    res.once('close', () => {
      const left = (inFlight.get(socket) ?? 1) - 1
      if (inFlight.has(socket)) inFlight.set(socket, left)
      if (closing && left === 0) endOnceQuiet(socket)
    })
  })
  let drain: NodeJS.Timeout | undefined
  app.addHook('preClose', async () => {
    closing = true
    for (const [socket, requests] of inFlight) if (requests === 0) socket.destroy()
    // An answer its client stopped reading (a download) would keep close() waiting until the
    // CLI's exit after 10 s, the database left open: past DRAIN_MS such connections are cut.
    // Every connection left goes then, a request or not: one opened while the other preClose
    // hooks ran (the server accepts until they end) and silent since would hold close() too.
    drain = setTimeout(() => {
      const answering = [...inFlight.values()].filter((requests) => requests > 0).length
      if (answering > 0) app.log.warn({ connections: answering }, `shutdown: cut the connections still answering ${DRAIN_MS / 1000} s after it began`)
      for (const socket of [...inFlight.keys()]) socket.destroy()
    }, DRAIN_MS)
    drain.unref()
  })
  app.addHook('onClose', async () => { clearTimeout(drain) })

  /**
   * Ends a connection whose last answer is done, a turn of the loop later: a next request
   * already in its buffer (a kept-alive client sends it the moment the answer ends) is parsed
   * and counted by then, and answered with `Connection: close` instead of cut off. What the
   * answer wrote is flushed before the end (a half-close, not a reset), and a client that
   * never closes its side is cut after END_GRACE_MS.
   */
  function endOnceQuiet (socket: Socket): void {
    setImmediate(() => {
      if (socket.destroyed || (inFlight.get(socket) ?? 0) > 0) return
      socket.end()
      setTimeout(() => socket.destroy(), END_GRACE_MS).unref()
    })
  }
}

/** How long a half-closed connection may wait for its client to close its side at shutdown. */
const END_GRACE_MS = 1_000

/** How long requests in flight at shutdown may go on answering before their connections are cut. */
const DRAIN_MS = 5_000

/**
 * Before connections drain, every answer from here on closes its connection, so no kept-alive
 * socket holds the server open once its request is done, and connections with no request are
 * closed at once. Registered before the background work, whose preClose hooks run after these
 * (hooks run in the order they were added): long-polls the event bus wakes then answer with
 * `Connection: close`.
 */
export const shutdownPlugin = fp(async (app: FastifyInstance) => {
  let closing = false
  app.addHook('onSend', async (_req, reply) => {
    if (closing) reply.header('connection', 'close')
  })
  closeQuietConnectionsOnShutdown(app)
  app.addHook('preClose', async () => { closing = true })
}, { name: 'shutdown' })
