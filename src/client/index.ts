import createClient, { type Client } from 'openapi-fetch'
import type { components, paths } from './schema.js'

/**
 * A typed client for the Parley API, from the generated OpenAPI types (schema.ts) and
 * openapi-fetch: every path, parameter, body and answer is checked by the compiler. The web
 * console uses it; so can any TypeScript program.
 *
 *   const parley = createParleyClient({ baseUrl: 'https://chat.example.org', keyId, secret })
 *   const { data, error } = await parley.POST('/v2/message', { body: { recipient: 'testbot', body: 'hi' } })
 */

export type { components, paths }
type Schemas = components['schemas']
export type Message = Schemas['Message']
export type Group = Schemas['Group']
export type User = Schemas['User']
export type Event = Schemas['Event']
export type ApiErrorBody = Schemas['Error']
export type ErrorCode = ApiErrorBody['code']
export type MessageStatus = Schemas['MessageStatus']
export type RosterEntry = Schemas['RosterEntry']
export type Whoami = Schemas['Whoami']
export type Conversation = Schemas['Conversation']
export type DeliveryStatus = MessageStatus['recipients'][number]['status']

export interface ParleyClientOptions {
  /** Where the API is, without /v2 ('' for the page's own origin). */
  baseUrl: string
  keyId: string
  secret: string
  fetch?: typeof globalThis.fetch
}

export type ParleyClient = Client<paths>

/** HTTP Basic for any characters: the credentials as UTF-8, then base64 (browsers and Node alike). */
export function basicAuthorization (keyId: string, secret: string): string {
  const bytes = new TextEncoder().encode(`${keyId}:${secret}`)
  let binary = ''
  for (const byte of bytes) binary += String.fromCharCode(byte)
  return `Basic ${btoa(binary)}`
}

export function createParleyClient (options: ParleyClientOptions): ParleyClient {
  const client = createClient<paths>({
    baseUrl: options.baseUrl,
    // A 401 must reach the caller, not open a browser's own Basic-auth prompt.
    credentials: 'omit',
    ...(options.fetch === undefined ? {} : { fetch: options.fetch })
  })
  const authorization = basicAuthorization(options.keyId, options.secret)
  client.use({ onRequest: ({ request }) => { request.headers.set('authorization', authorization) } })
  return client
}
