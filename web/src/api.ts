import type { DeliveryStatus, FeedEvent, Group, Message, MessageStatus, RosterEntry, SearchAnswer, Whoami } from './types.js'

export interface Credentials { keyId: string, secret: string }

/** An error answer of the API: its status, stable code and message for people. */
export class ApiError extends Error {
  constructor (readonly status: number, readonly code: string, message: string) { super(message) }
}

/** HTTP Basic for any characters: the credentials as UTF-8, then base64. */
function basic ({ keyId, secret }: Credentials): string {
  const bytes = new TextEncoder().encode(`${keyId}:${secret}`)
  let binary = ''
  for (const byte of bytes) binary += String.fromCharCode(byte)
  return `Basic ${btoa(binary)}`
}

export type Api = ReturnType<typeof createApi>

/** The /v2 routes the console uses, as one key. */
export function createApi (credentials: Credentials) {
  const authorization = basic(credentials)

  async function call (method: string, path: string, body?: object | FormData, signal?: AbortSignal): Promise<Response> {
    const headers: Record<string, string> = { authorization }
    let payload: BodyInit | undefined
    if (body instanceof FormData) payload = body
    else if (body !== undefined) {
      headers['content-type'] = 'application/json'
      payload = JSON.stringify(body)
    }
    // credentials: 'omit' — a 401 must come back to this code, not open the browser's own
    // Basic-auth prompt; the Authorization header is set here, so nothing else is needed.
    const res = await fetch(`/v2${path}`, { method, headers, body: payload, signal, credentials: 'omit' })
    if (!res.ok) {
      const error = await res.json().catch(() => ({})) as { code?: string, message?: string }
      throw new ApiError(res.status, error.code ?? 'UNKNOWN', error.message ?? `${method} ${path} answered ${res.status}`)
    }
    return res
  }
  const json = async <T>(method: string, path: string, body?: object | FormData, signal?: AbortSignal): Promise<T> =>
    await (await call(method, path, body, signal)).json() as T

  return {
    whoami: () => json<Whoami>('GET', '/whoami'),
    events: (after: string, wait: number, signal?: AbortSignal) =>
      json<{ events: FeedEvent[], last: string }>('GET', `/events?after=${after}&limit=1000&wait=${wait}`, undefined, signal),
    roster: () => json<{ entries: RosterEntry[] }>('GET', '/roster'),
    group: (id: string) => json<Group>('GET', `/group/${encodeURIComponent(id)}`),
    /** A conversation's messages, newest first, a page at a time. */
    conversation: (peer: string, cursor?: string) =>
      json<SearchAnswer>('POST', '/search', { with: peer, types: ['messages'], limit: 50, ...(cursor === undefined ? {} : { cursor }) }),
    send: (form: FormData) => json<Message>('POST', '/message', form),
    status: (id: string) => json<MessageStatus>('GET', `/message/${encodeURIComponent(id)}/status`),
    report: async (id: string, status: Exclude<DeliveryStatus, 'sent'>) => { await call('POST', '/message/status', { message: id, status }) },
    typing: async (recipient: string) => { await call('POST', '/message/typing', { recipient }) },
    stopTyping: async (recipient: string) => { await call('DELETE', `/message/typing/${encodeURIComponent(recipient)}`) },
    attachment: async (id: string, n: number) => await (await call('GET', `/message/${encodeURIComponent(id)}/attachment/${n}`)).blob()
  }
}
