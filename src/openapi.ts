import { STATUS_CODES } from 'node:http'
import { Type, type TSchema } from 'typebox'

/**
 * What @fastify/swagger builds from the route schemas is right about every field the service
 * checks; this file adds what a client generator also needs and a route schema cannot say:
 * shared components instead of repeated inline objects, a discriminated union as `oneOf`, file
 * parts and downloads as bytes, the headers every answer carries, and routes that need no
 * credentials. It runs once, when the document is first asked for.
 */

type Json = Record<string, unknown>
interface Operation {
  security?: unknown[]
  requestBody?: { content?: Record<string, { schema?: Json }> }
  responses?: Record<string, Json & { description?: string, content?: Record<string, { schema?: Json }>, headers?: Json }>
}
interface Document {
  info: Json
  servers?: unknown[]
  paths: Record<string, Record<string, Operation>>
  components: { schemas?: Record<string, Json>, headers?: Record<string, Json>, securitySchemes?: Json }
}

const header = (description: string, schema: TSchema = Type.String()): Json => ({ description, schema })

/** Headers every /v2 answer carries, and those of the send and of refusals (API.md §1–2). */
const HEADERS: Record<string, Json> = {
  RequestId: header('The request id: the client\'s own X-Request-Id when it is a plain token, else a new UUID'),
  RateLimitLimit: header('Requests per second this key (or address) may make', Type.Integer()),
  RateLimitRemaining: header('Requests left in the current second', Type.Integer()),
  RateLimitReset: header('Seconds until the limit refills', Type.Integer()),
  RetryAfter: header('Seconds to wait before retrying', Type.Integer()),
  QuotaLimit: header('Messages this key may send per UTC day', Type.Integer()),
  QuotaRemaining: header('Messages left today', Type.Integer()),
  QuotaReset: header('Epoch seconds of the next UTC midnight, when the quota refills', Type.Integer()),
  IdempotentReplayed: header('"true" when this answers an earlier send with the same Idempotency-Key'),
  ETag: header('The SHA-256 of the file, quoted'),
  ContentRange: header('bytes first-last/size of a partial answer, or bytes */size with 416'),
  ContentDisposition: header('attachment, with the filename in an ASCII-safe and an RFC 5987 form')
}
const ref = (name: string): Json => ({ $ref: `#/components/headers/${name}` })

/** Replaces every inline object that has a title with a reference to it under components.schemas. */
function hoist (node: unknown, schemas: Record<string, Json>, top = true): unknown {
  if (Array.isArray(node)) return node.map((item) => hoist(item, schemas, false))
  if (node === null || typeof node !== 'object') return node
  const object = node as Json
  const walked: Json = {}
  for (const [key, value] of Object.entries(object)) walked[key] = hoist(value, schemas, false)
  const title = walked.title
  if (!top && typeof title === 'string' && /^[A-Z][A-Za-z]*$/.test(title) && walked.$ref === undefined) {
    const existing = schemas[title]
    if (existing === undefined) {
      schemas[title] = walked
      return { $ref: `#/components/schemas/${title}` }
    }
    if (JSON.stringify(existing) === JSON.stringify(walked)) return { $ref: `#/components/schemas/${title}` }
  }
  return walked
}

/**
 * A union with a discriminator (TypeBox writes `anyOf`) as OpenAPI states one: `oneOf`, as its
 * members are told apart by the property, with the mapping from each member's value of it.
 */
function discriminate (schema: Json, schemas: Record<string, Json>): void {
  const discriminator = schema.discriminator as { propertyName: string, mapping?: Record<string, string> } | undefined
  if (discriminator === undefined || !Array.isArray(schema.anyOf)) return
  schema.oneOf = schema.anyOf
  delete schema.anyOf
  discriminator.mapping = {}
  for (const member of schema.oneOf as Json[]) {
    const $ref = member.$ref as string
    const property = (schemas[$ref.split('/').at(-1)!]?.properties as Record<string, { enum?: string[] }> | undefined)?.[discriminator.propertyName]
    discriminator.mapping[property!.enum![0]!] = $ref
  }
}

/** The OpenAPI document, finished for client generators and linters (see the top of this file). */
export function polishOpenApi (document: unknown): unknown {
  const doc = document as Document
  doc.info.license = { name: 'Proprietary: self-hosted by its operator' }
  doc.servers = [{ url: '/', description: 'This Parley server' }]
  const schemas = doc.components.schemas ??= {}
  doc.components.headers = HEADERS

  for (const [path, methods] of Object.entries(doc.paths)) {
    for (const [method, operation] of Object.entries(methods)) {
      const key = `${method.toUpperCase()} ${path}`
      const authenticated = path.startsWith('/v2/')
      if (!authenticated) operation.security = []
      for (const [status, response] of Object.entries(operation.responses ?? {})) {
        if (response.$ref !== undefined) continue
        if (response.description === undefined || response.description === 'Default Response') {
          response.description = STATUS_CODES[status] ?? 'Answer'
        }
        const headers: Json = { ...response.headers }
        if (authenticated) {
          Object.assign(headers, { 'X-Request-Id': ref('RequestId'), 'X-RateLimit-Limit': ref('RateLimitLimit'), 'X-RateLimit-Remaining': ref('RateLimitRemaining'), 'X-RateLimit-Reset': ref('RateLimitReset') })
        }
        if (status === '429' || status === '503') headers['Retry-After'] = ref('RetryAfter')
        if (key === 'POST /v2/message' && (status === '200' || status === '429')) {
          Object.assign(headers, { 'X-Quota-Limit': ref('QuotaLimit'), 'X-Quota-Remaining': ref('QuotaRemaining'), 'X-Quota-Reset': ref('QuotaReset') })
          if (status === '200') headers['Idempotent-Replayed'] = ref('IdempotentReplayed')
        }
        if (key === 'GET /v2/message/{message}/attachment/{n}' && (status === '200' || status === '206')) {
          Object.assign(headers, { ETag: ref('ETag'), 'Content-Disposition': ref('ContentDisposition') })
          if (status === '206') headers['Content-Range'] = ref('ContentRange')
          // The bytes as uploaded, in their own type: not JSON.
          response.content = { 'application/octet-stream': { schema: { type: 'string', format: 'binary' } } }
        }
        if (Object.keys(headers).length > 0) response.headers = headers
      }
      // A file part is bytes, and only multipart carries one.
      if (key === 'POST /v2/message') {
        const content = operation.requestBody?.content ?? {}
        for (const [type, shared] of Object.entries(content)) {
          // The content types share one object: each gets its own copy first.
          const media = content[type] = structuredClone(shared)
          const properties = media.schema?.properties as Json | undefined
          if (properties?.attachment === undefined) continue
          if (type === 'multipart/form-data') {
            properties.attachment = { type: 'array', description: 'One file part per attachment, each with its own Content-Type', items: { type: 'string', format: 'binary' } }
          } else {
            delete properties.attachment
          }
        }
      }
    }
  }
  doc.paths = hoist(doc.paths, schemas, false) as Document['paths']
  for (const schema of Object.values(schemas)) discriminate(schema, schemas)
  // Only the headers some answer uses.
  const text = JSON.stringify(doc.paths)
  doc.components.headers = Object.fromEntries(Object.entries(HEADERS).filter(([name]) => text.includes(`"#/components/headers/${name}"`)))
  return doc
}
