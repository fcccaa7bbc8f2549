import { randomUUID } from 'node:crypto'
import type { Duplex, Writable } from 'node:stream'
import { STATUS_CODES, type Server } from 'node:http'
import type { FastifyHttpOptions } from 'fastify'
import type { Config } from './config.js'
import { AppError, ValidationFailed } from './errors.js'
import { BODY_LIMIT } from './plugins/body-parsers.js'
import { sendError } from './plugins/errors.js'
import { buildValidator } from './validation.js'

// A client's own request id is kept when it is a plain token, so traces join up across proxies.
const REQUEST_ID = /^[A-Za-z0-9._:-]{1,128}$/

/** Logged nowhere: credentials in any header a log line might carry. */
const REDACTED_PATHS = [
  'req.headers.authorization',
  'req.headers["proxy-authorization"]',
  'headers.authorization',
  'headers["proxy-authorization"]'
]

/** The Fastify server's own settings: logging, proxies, request ids, limits and timeouts. */
export function serverOptions (config: Config, logStream: Writable | undefined) {
  return {
    logger: {
      level: config.logLevel,
      redact: { paths: REDACTED_PATHS, censor: '[redacted]' },
      ...(logStream !== undefined ? { stream: logStream } : {})
    },
    // A hop count trusts that many proxies nearest to the server.
    trustProxy: typeof config.trustProxy === 'number'
      ? ((hops: number) => (_address: string, hop: number) => hop < hops)(config.trustProxy)
      : config.trustProxy,
    bodyLimit: BODY_LIMIT,
    schemaController: { compilersFactory: { buildValidator } },
    requestIdHeader: false,
    genReqId: (req) => {
      const given = req.headers['x-request-id']
      return typeof given === 'string' && REQUEST_ID.test(given) ? given : randomUUID()
    },
    // Errors the router raises before any hook runs: answered in the contract's shape too.
    frameworkErrors: (err, req, reply) => {
      reply.header('x-request-id', req.id)
      const error = err.code === 'FST_ERR_MAX_PARAM_LENGTH'
        ? new AppError(414, 'VALIDATION_FAILED', 'A path segment is longer than 100 characters')
        : new ValidationFailed(`Malformed URL: ${err.message}`)
      sendError(reply, error)
    },
    // Slow clients (slow-loris): the headers must arrive within 10 s and the whole request
    // within REQUEST_TIMEOUT_SECONDS, checked every second; these clocks stop once the request
    // is in, so a long-poll's wait does not count. A socket idle for longer than the longest
    // wait (30 s) plus a margin is closed.
    http: {
      headersTimeout: Math.min(10, config.requestTimeoutSeconds) * 1000,
      connectionsCheckingInterval: 1000
    },
    requestTimeout: config.requestTimeoutSeconds * 1000,
    connectionTimeout: 65_000,
    // What Node's HTTP parser refuses before Fastify sees a request (a timeout, headers too
    // large, bytes that are not HTTP, a Content-Length the body does not keep): answered in the
    // contract's shape too, then the socket closed, as Fastify's own handler does.
    clientErrorHandler: (err: NodeJS.ErrnoException, socket: Duplex) => {
      if (err.code === 'ECONNRESET' || socket.destroyed) return
      const [status, message] = err.code === 'ERR_HTTP_REQUEST_TIMEOUT'
        ? [408, `the request did not arrive whole within ${config.requestTimeoutSeconds} s`]
        : err.code === 'HPE_HEADER_OVERFLOW'
          ? [431, 'the request headers are too large']
          : [400, 'malformed HTTP request']
      const body = JSON.stringify(new AppError(status, 'VALIDATION_FAILED', message).toJSON())
      if (socket.writable) {
        socket.write(`HTTP/1.1 ${status} ${STATUS_CODES[status]}\r\nConnection: close\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`)
      }
      socket.destroy()
    }
  } satisfies FastifyHttpOptions<Server>
}
