/**
 * What a key may do (API.md §9): `read` every GET and the reads that are POSTs, `send` every
 * other write outside /admin, `admin` the /admin routes. A new key gets read and send.
 */
export const SCOPES = ['read', 'send', 'admin'] as const

export type Scope = typeof SCOPES[number]

export const DEFAULT_SCOPES: Scope[] = ['read', 'send']

export const isScope = (text: string): text is Scope => (SCOPES as readonly string[]).includes(text)

/** Writes that only read or tidy the caller's own view, so a read-only key may make them. */
const READING_WRITES = new Set(['POST /v2/search', 'POST /v2/events/ack', 'DELETE /v2/events'])

/** The scope a route needs, from its method and path template (`/v2/message/:message`). */
export function requiredScope (method: string, route: string): Scope {
  if (route === '/v2/admin' || route.startsWith('/v2/admin/')) return 'admin'
  if (method === 'GET' || method === 'HEAD') return 'read'
  if (READING_WRITES.has(`${method} ${route}`) || route === '/v2/webhooks' || route.startsWith('/v2/webhooks/')) return 'read'
  return 'send'
}
