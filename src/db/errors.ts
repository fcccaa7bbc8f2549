const CONNECTION_CODES = new Set([
  'ECONNREFUSED', 'ECONNRESET', 'ENOTFOUND', 'ETIMEDOUT', 'EPIPE', 'EHOSTUNREACH',
  // PostgreSQL: connection exceptions (class 08) and operator intervention (57P0x).
  '08000', '08001', '08003', '08004', '08006', '57P01', '57P02', '57P03'
])

/** True for errors that mean "the database is not answering", as opposed to a bad query. */
export function isDatabaseUnavailable (err: unknown): boolean {
  if (!(err instanceof Error)) return false
  const code = (err as { code?: unknown }).code
  if (typeof code === 'string' && CONNECTION_CODES.has(code)) return true
  if (/Connection terminated|timeout exceeded when trying to connect|Client has encountered a connection error/i.test(err.message)) return true
  return err.cause !== undefined && err.cause !== err && isDatabaseUnavailable(err.cause)
}

/** The SQLSTATE of a failed query, looking through Drizzle's wrapping. */
export function sqlState (err: unknown): string | undefined {
  for (let e: unknown = err; e instanceof Error; e = e.cause) {
    const code = (e as { code?: unknown }).code
    if (typeof code === 'string' && /^[0-9A-Z]{5}$/.test(code)) return code
  }
  return undefined
}

/**
 * What of a failure goes into the log. Drizzle's query errors carry the query's parameters
 * (message bodies, addresses) in their message: keep the SQL text and the driver's own error,
 * never the parameters.
 */
export function loggableError (err: unknown): unknown {
  if (!(err instanceof Error)) return err
  if (typeof (err as { query?: unknown }).query === 'string' && Array.isArray((err as { params?: unknown }).params)) {
    const cause = err.cause as { message?: string, code?: string } | undefined
    return {
      type: 'DrizzleQueryError',
      query: (err as Error & { query?: string }).query,
      cause: { message: cause?.message, code: cause?.code },
      // Only the frames: the first lines repeat the message, parameters included.
      stack: err.stack?.split('\n').filter((line) => /^\s+at /.test(line)).join('\n')
    }
  }
  return err
}
