import { STATUS_CODES } from 'node:http'

/** Stable error codes for programs (API.md §1 and §9); the OpenAPI document lists them too. */
export const ERROR_CODES = [
  'UNAUTHORIZED', 'FORBIDDEN', 'NOT_FOUND', 'CONFLICT', 'VALIDATION_FAILED', 'UNSUPPORTED_MEDIA_TYPE', 'PAYLOAD_TOO_LARGE',
  'RATE_LIMITED', 'QUOTA_EXCEEDED', 'IDEMPOTENCY_MISMATCH', 'IDEMPOTENCY_IN_PROGRESS', 'UNAVAILABLE', 'INTERNAL',
  'RANGE_NOT_SATISFIABLE', 'SEALED_KEY_MISSING'
] as const

export type ErrorCode = typeof ERROR_CODES[number]

/** An error the service means to answer: a status, a stable code and a message for people. */
export class AppError extends Error {
  readonly statusCode: number
  readonly code: ErrorCode
  readonly headers: Record<string, string>

  constructor (statusCode: number, code: ErrorCode, message: string, headers: Record<string, string> = {}) {
    // An answer to the client's request (4xx) needs no stack, and collecting one was the largest
    // single cost of refusing a request (about 18 µs of a 429's ~200): a flood of refused
    // requests is cheaper to refuse this way. A 5xx keeps its stack for the log.
    const stackTraceLimit = Error.stackTraceLimit
    if (statusCode < 500) Error.stackTraceLimit = 0
    super(message)
    Error.stackTraceLimit = stackTraceLimit
    this.name = new.target.name
    this.statusCode = statusCode
    this.code = code
    this.headers = headers
  }

  toJSON (): ErrorBody {
    return { statusCode: this.statusCode, error: STATUS_CODES[this.statusCode] ?? 'Error', message: this.message, code: this.code }
  }
}

export interface ErrorBody {
  statusCode: number
  error: string
  message: string
  code: ErrorCode
}

export class Unauthorized extends AppError {
  constructor (message = 'Missing or invalid API key credentials (HTTP Basic: key id and secret)') {
    super(401, 'UNAUTHORIZED', message, { 'www-authenticate': 'Basic realm="parley"' })
  }
}

export class Forbidden extends AppError {
  constructor (message: string) { super(403, 'FORBIDDEN', message) }
}

export class NotFound extends AppError {
  /** `new NotFound('message', id)` → "message msg_… not found". */
  constructor (thing: string, id?: string) {
    super(404, 'NOT_FOUND', id === undefined ? `${thing} not found` : `${thing} ${id} not found`)
  }
}

export class Conflict extends AppError {
  constructor (message: string) { super(409, 'CONFLICT', message) }
}

export class ValidationFailed extends AppError {
  constructor (message: string) { super(400, 'VALIDATION_FAILED', message) }
}

export class UnsupportedMediaType extends AppError {
  constructor (message: string) { super(415, 'UNSUPPORTED_MEDIA_TYPE', message) }
}

export class PayloadTooLarge extends AppError {
  constructor (message: string) { super(413, 'PAYLOAD_TOO_LARGE', message) }
}

export class Unavailable extends AppError {
  constructor (message = 'The database is unavailable; try again shortly') {
    super(503, 'UNAVAILABLE', message, { 'retry-after': '1' })
  }
}

export const RATE_LIMIT_MESSAGE = 'Too many requests/second, please try again later'

export class RateLimited extends AppError {
  constructor (message = RATE_LIMIT_MESSAGE, retryAfterSeconds = 1) { super(429, 'RATE_LIMITED', message, { 'retry-after': String(retryAfterSeconds) }) }
}

/** An unexpected failure; the cause is logged, never answered. */
export class Internal extends AppError {
  constructor (cause: unknown) {
    super(500, 'INTERNAL', 'Internal server error')
    this.cause = cause
  }
}
