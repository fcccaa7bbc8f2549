import { basicAuthorization, createParleyClient } from '../../src/client/index.js'
import type { DeliveryStatus, FeedEvent } from './types.js'

export interface Credentials { keyId: string, secret: string }

/** An error answer of the API: its status, stable code and message for people. */
export class ApiError extends Error {
  constructor (readonly status: number, readonly code: string, message: string) { super(message) }
}

export type Api = ReturnType<typeof createApi>

/**
 * Reads `GET /v2/events/stream` (Server-Sent Events) until it ends, calling onEvent for each
 * event in order. A fetch, not EventSource: EventSource cannot send an Authorization header.
 * Resolves false when this server offers no stream (any answer but a 200 event stream, 401
 * aside), so the caller can long-poll instead; true when an open stream ended.
 */
async function readStream (authorization: string, after: string, signal: AbortSignal, onEvent: (event: FeedEvent) => void): Promise<boolean> {
  const res = await fetch(`/v2/events/stream?after=${encodeURIComponent(after)}`, {
    headers: { authorization, accept: 'text/event-stream' }, credentials: 'omit', signal
  })
  if (res.status === 401) throw new ApiError(401, 'UNAUTHORIZED', 'the key was refused')
  if (!res.ok || res.body === null || !(res.headers.get('content-type') ?? '').startsWith('text/event-stream')) {
    await res.body?.cancel()
    return false
  }
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader()
  let buffered = ''
  for (;;) {
    const { value, done } = await reader.read()
    if (done) return true
    buffered += value
    // Frames end with a blank line; only `data:` lines matter here (the event carries its id and type).
    let end: number
    while ((end = buffered.indexOf('\n\n')) >= 0) {
      const frame = buffered.slice(0, end)
      buffered = buffered.slice(end + 2)
      const data = frame.split('\n').filter((line) => line.startsWith('data:')).map((line) => line.slice(5).trimStart()).join('\n')
      if (data !== '') onEvent(JSON.parse(data) as FeedEvent)
    }
  }
}

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
  const authorization = basicAuthorization(keyId, secret)
  const message = (id: string) => ({ params: { path: { message: id } } })

  return {
    whoami: async () => ok(await client.GET('/v2/whoami'), 'whoami'),
    events: async (after: string, wait: number, signal?: AbortSignal) =>
      ok(await client.GET('/v2/events', { params: { query: { after, limit: 1000, wait } }, ...(signal === undefined ? {} : { signal }) }), 'events'),
    /** The feed as it happens, after `after` (see readStream). */
    stream: async (after: string, signal: AbortSignal, onEvent: (event: FeedEvent) => void) => readStream(authorization, after, signal, onEvent),
    /** The whole roster, a page of 200 entries at a time (the server answers 50 unless asked). */
    roster: async () => {
      const entries = []
      let cursor: string | undefined
      for (;;) {
        const page = ok(await client.GET('/v2/roster', { params: { query: { limit: 200, ...(cursor === undefined ? {} : { cursor }) } } }), 'roster')
        entries.push(...page.entries)
        if (page.nextCursor === null) return { entries }
        cursor = page.nextCursor
      }
    },
    group: async (id: string) => ok(await client.GET('/v2/group/{group}', { params: { path: { group: id } } }), 'group'),
    /** Every conversation, newest first, with its last message and the server's unread count. */
    conversations: async () => {
      const conversations = []
      let cursor: string | undefined
      for (;;) {
        const page = ok(await client.GET('/v2/conversations', { params: { query: { limit: 200, ...(cursor === undefined ? {} : { cursor }) } } }), 'conversations')
        conversations.push(...page.conversations)
        if (page.nextCursor === null) return conversations
        cursor = page.nextCursor
      }
    },
    /** A page of a conversation's history, newest first, before message `from` (or from the newest). */
    history: async (peer: string, from?: string) =>
      ok(await client.GET('/v2/conversations/{peer}/messages', { params: { path: { peer }, query: { limit: 50, ...(from === undefined ? {} : { from }) } } }), 'history'),
    /** Marks everything from others in the conversation read, up to message `upTo`. */
    markRead: async (peer: string, upTo: string) => {
      ok(await client.POST('/v2/conversations/{peer}/read', { params: { path: { peer } }, body: { upTo } }), 'read')
    },
    send: async (form: FormData) => ok(await client.POST('/v2/message', {
      // The form as the browser encodes it (multipart, with the files' own types).
      body: {} as never,
      bodySerializer: () => form
    }), 'send'),
    /** One message as it is now (its body, edit and reactions). */
    message: async (id: string) => ok(await client.GET('/v2/message/{message}', message(id)), 'message'),
    edit: async (id: string, body: string) => ok(await client.PATCH('/v2/message/{message}', { ...message(id), body: { body } }), 'edit'),
    /** Adds (or, with `on` false, takes back) one's reaction with `emoji`; idempotent either way. */
    react: async (id: string, emoji: string, on: boolean) => {
      const params = { params: { path: { message: id, emoji } } }
      ok(on ? await client.PUT('/v2/message/{message}/reactions/{emoji}', params) : await client.DELETE('/v2/message/{message}/reactions/{emoji}', params), 'reaction')
    },
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

/** An error as the page shows it: the API's message, or what went wrong on the way. */
export const describe = (err: unknown) => err instanceof Error ? err.message : String(err)
