import { createParleyClient } from '../../src/client/index.js'
import type { DeliveryStatus } from './types.js'

export interface Credentials { keyId: string, secret: string }

/** An error answer of the API: its status, stable code and message for people. */
export class ApiError extends Error {
  constructor (readonly status: number, readonly code: string, message: string) { super(message) }
}

export type Api = ReturnType<typeof createApi>

interface Answer<T> { data?: T, error?: unknown, response: Response }

/** The data of a 2xx answer; anything else becomes an ApiError with the contract's code and message. */
function ok<T> ({ data, error, response }: Answer<T>, what: string): T {
  if (response.ok) return data as T
  const body = (error ?? {}) as { code?: string, message?: string }
  throw new ApiError(response.status, body.code ?? 'UNKNOWN', body.message ?? `${what} answered ${response.status}`)
}

/** The /v2 routes the console uses, as one key, through the typed client. */
export function createApi ({ keyId, secret }: Credentials) {
  const client = createParleyClient({ baseUrl: '', keyId, secret })
  const message = (id: string) => ({ params: { path: { message: id } } })

  return {
    whoami: async () => ok(await client.GET('/v2/whoami'), 'whoami'),
    events: async (after: string, wait: number, signal?: AbortSignal) =>
      ok(await client.GET('/v2/events', { params: { query: { after, limit: 1000, wait } }, ...(signal === undefined ? {} : { signal }) }), 'events'),
    roster: async () => ok(await client.GET('/v2/roster'), 'roster'),
    group: async (id: string) => ok(await client.GET('/v2/group/{group}', { params: { path: { group: id } } }), 'group'),
    /** A conversation's messages, newest first, a page at a time. */
    conversation: async (peer: string, cursor?: string) =>
      ok(await client.POST('/v2/search', { body: { with: peer, types: ['messages'], limit: 50, ...(cursor === undefined ? {} : { cursor }) } }), 'search'),
    send: async (form: FormData) => ok(await client.POST('/v2/message', {
      // The form as the browser encodes it (multipart, with the files' own types).
      body: {} as never,
      bodySerializer: () => form
    }), 'send'),
    status: async (id: string) => ok(await client.GET('/v2/message/{message}/status', message(id)), 'status'),
    report: async (id: string, status: Exclude<DeliveryStatus, 'sent'>) => {
      ok(await client.POST('/v2/message/status', { body: { message: id, status } }), 'report')
    },
    typing: async (recipient: string) => { ok(await client.POST('/v2/message/typing', { body: { recipient } }), 'typing') },
    stopTyping: async (recipient: string) => {
      ok(await client.DELETE('/v2/message/typing/{recipient}', { params: { path: { recipient } } }), 'stop typing')
    },
    attachment: async (id: string, n: number) => ok(await client.GET('/v2/message/{message}/attachment/{n}', {
      params: { path: { message: id, n: String(n) } },
      parseAs: 'blob'
    }), 'attachment')
  }
}
