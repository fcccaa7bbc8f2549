import type { Socket } from 'node:net'
import type { FastifyInstance } from 'fastify'

/**
 * Closes, at shutdown, every connection that carries no request. Node's closeIdleConnections()
 * skips a connection that has not sent a request yet (it counts as waiting for headers): HTTP
 * clients open such spare connections (undici does beside a long-poll), and each one held
 * close() until its socket timed out, 65 s later. A connection in the middle of a request is
 * left to finish; its answer carries `Connection: close`.
 */
export function closeQuietConnectionsOnShutdown (app: FastifyInstance): void {
  const inFlight = new Map<Socket, number>()
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
    })
  })
  app.addHook('preClose', async () => {
    for (const [socket, requests] of inFlight) if (requests === 0) socket.destroy()
  })
}
