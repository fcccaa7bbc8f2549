import type { FastifyError, FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import fp from 'fastify-plugin'
import { isDatabaseUnavailable, loggableError } from '../db/errors.js'
import { AppError, Internal, NotFound, PayloadTooLarge, RateLimited, Unauthorized, Unavailable, UnsupportedMediaType, ValidationFailed } from '../errors.js'
const ACCEPTED_TYPES = 'application/json, application/x-www-form-urlencoded, or multipart/form-data where files are taken'

/**
 * What a multipart field typed application/json that is not JSON is answered, on either path:
 * streamed (@fastify/multipart's error, below) or read whole (messages/whole-multipart.ts).
 */
export const INVALID_JSON_FIELD = 'body: a multipart field whose Content-Type is application/json is not valid JSON'

/** Turns Fastify's and its plugins' errors into the application errors of the contract. */
function toAppError (err: FastifyError, req: FastifyRequest, limits: { maxAttachments: number, maxAttachmentBytes: number }): AppError {
  if (err instanceof AppError) return err
  if (err.validation !== undefined) return new ValidationFailed(err.message)
  switch (err.code) {
    case 'FST_ERR_CTP_INVALID_MEDIA_TYPE':
      return new UnsupportedMediaType(`Content-Type ${JSON.stringify(req.headers['content-type'] ?? '')} is not accepted; send ${ACCEPTED_TYPES}`)
    case 'FST_ERR_CTP_INVALID_CONTENT_LENGTH':
      return new ValidationFailed('Content-Length does not match the body')
    case 'FST_ERR_CTP_BODY_TOO_LARGE':
      return new PayloadTooLarge(`Request body is larger than the ${req.routeOptions.bodyLimit ?? 0} bytes allowed`)
    case 'FST_ERR_CTP_EMPTY_JSON_BODY':
      return new ValidationFailed('body: a JSON body was announced but is empty')
    case 'FST_ERR_CTP_INVALID_JSON_BODY':
    case 'FST_ERR_CTP_INVALID_CONTENT_TYPE':
      return new ValidationFailed(`body: ${err.message}`)
    case 'FST_REQ_FILE_TOO_LARGE':
      return new PayloadTooLarge(`attachment: each file may be at most ${limits.maxAttachmentBytes} bytes`)
    case 'FST_FILES_LIMIT':
      return new ValidationFailed(`attachment: at most ${limits.maxAttachments} files per message`)
    case 'FST_PARTS_LIMIT':
    case 'FST_FIELDS_LIMIT':
      return new ValidationFailed('body: too many multipart parts')
    case 'FST_PROTO_VIOLATION':
      return new ValidationFailed('body: field names __proto__ and constructor are not allowed')
    case 'FST_INVALID_JSON_FIELD_ERROR':
      return new ValidationFailed(INVALID_JSON_FIELD)
    case 'FST_MP_PREMATURE_CLOSE':
      return new ValidationFailed('body: the multipart body ended early')
    case 'FST_BASIC_AUTH_MISSING_OR_BAD_AUTHORIZATION_HEADER':
      return new Unauthorized('Missing or malformed Authorization header: use HTTP Basic with your key id and secret')
  }
  // busboy's parse errors carry no status: a malformed multipart body is the client's fault.
  if (err.statusCode === undefined && /[\\/]@fastify[\\/]busboy[\\/]/.test(err.stack ?? '')) {
    // A body that ends inside a part is told by busboy from the part's stream or from the
    // parser's end, depending on which of them the handler was reading when it came: one
    // cause, one message, whichever way the body was read.
    const message = err.message === 'Part terminated early due to unexpected end of multipart data' ? 'Unexpected end of multipart data' : err.message
    return new ValidationFailed(`body: malformed multipart/form-data (${message})`)
  }
  if (isDatabaseUnavailable(err)) return new Unavailable()
  const status = err.statusCode ?? 500
  if (status === 401) return new Unauthorized()
  if (status === 429) return new RateLimited()
  if (status === 413) return new PayloadTooLarge(err.message)
  if (status === 415) return new UnsupportedMediaType(err.message)
  // Remaining client errors (busboy's malformed multipart, bad headers): the message is safe to show.
  if (status >= 400 && status < 500) return new AppError(status, 'VALIDATION_FAILED', err.message)
  return new Internal(err)
}

export function sendError (reply: FastifyReply, error: AppError): FastifyReply {
  for (const [name, value] of Object.entries(error.headers)) reply.header(name, value)
  return reply.code(error.statusCode).type('application/json; charset=utf-8').send(error.toJSON())
}

/**
 * The one place errors become HTTP: `{ statusCode, error, message, code }`. A 5xx is logged
 * with its cause and answered with a generic message, since database errors carry SQL and
 * parameters.
 */
export interface ErrorsOptions {
  maxAttachments: number
  maxAttachmentBytes: number
  /** Told the code of every error answered (metrics). */
  onError?: (code: string) => void
}

export const errorsPlugin = fp(async (app: FastifyInstance, opts: ErrorsOptions) => {
  app.setErrorHandler((err: FastifyError, req, reply) => {
    // The client closed its socket mid-request (an aborted upload): its ECONNRESET is not the
    // database's, and no one is left to answer. Logged as what it is, counted as nothing.
    if (req.raw.destroyed && (err.code === 'ECONNRESET' || err.code === 'FST_PREMATURE_CLOSE' || err.message === 'aborted')) {
      req.log.info({ reason: err.message }, 'client aborted the request')
      return reply.code(400).send()
    }
    const error = toAppError(err, req, opts)
    opts.onError?.(error.code)
    if (error.statusCode >= 500) {
      req.log.error({ err: loggableError(error.cause ?? err), code: error.code }, 'request failed')
    }
    return sendError(reply, error)
  })

  app.setNotFoundHandler(answerUnknownRoute)
}, { name: 'parley-errors' })

/** 404 NOT_FOUND naming the method and path (without its query) that matched no route. */
export function answerUnknownRoute (req: FastifyRequest, reply: FastifyReply): FastifyReply {
  const path = req.url.split('?')[0] ?? req.url
  return sendError(reply, new NotFound('route', `${req.method} ${path}`))
}
