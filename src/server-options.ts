import { randomUUID } from 'node:crypto'
import type { Writable } from 'node:stream'
import type { Server } from 'node:http'
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
    connectionTimeout: 65_000
  } satisfies FastifyHttpOptions<Server>
}
