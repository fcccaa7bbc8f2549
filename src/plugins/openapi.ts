import { STATUS_CODES } from 'node:http'
import swagger from '@fastify/swagger'
import swaggerUi from '@fastify/swagger-ui'
import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import { ErrorSchema } from '../schemas.js'

type Json = Record<string, unknown>
interface Response { $ref?: string, description?: string, headers?: Record<string, Json> }
interface Operation { security?: unknown[], responses?: Record<string, Response> }
interface Document {
  paths: Record<string, Record<string, Operation>>
  components: { schemas?: Record<string, Json>, headers?: Record<string, Json> }
}

const header = (title: string, description: string, type = 'string'): Json => ({ description, schema: { type, title } })

/** What the request-id and rate-limit plugins put on every answer of a route that takes credentials. */
const EVERY_ANSWER: Record<string, Json> = {
  'X-Request-Id': header('RequestId', 'The request id: the client\'s own X-Request-Id when it is a plain token, else a new UUID'),
  'X-RateLimit-Limit': header('RateLimitLimit', 'Requests per second this key (or address) may make', 'integer'),
  'X-RateLimit-Remaining': header('RateLimitRemaining', 'Requests left in the current second', 'integer'),
  'X-RateLimit-Reset': header('RateLimitReset', 'Seconds until the limit refills', 'integer')
}
/** What every 429 and 503 carries (errors.ts). */
const RETRY_AFTER = header('RetryAfter', 'Seconds to wait before retrying', 'integer')

/**
 * A header whose schema has a title, as a reference to components.headers under that title: the
 * routes' own (withHeaders in src/schemas.ts) and those above.
 */
function hoistHeaders (headers: Record<string, Json>, components: Record<string, Json>): Record<string, Json> {
  return Object.fromEntries(Object.entries(headers).map(([name, value]) => {
    const { title, ...schema } = value.schema as Json
    if (typeof title !== 'string') return [name, value]
    components[title] ??= { description: value.description, schema }
    return [name, { $ref: `#/components/headers/${title}` }]
  }))
}

/** Replaces every inline object that has a title with a reference to it under components.schemas. */
function hoist (node: unknown, schemas: Record<string, Json>, top = true): unknown {
  if (Array.isArray(node)) return node.map((item) => hoist(item, schemas, false))
  if (node === null || typeof node !== 'object') return node
  const walked: Json = {}
  for (const [key, value] of Object.entries(node)) walked[key] = hoist(value, schemas, false)
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

/**
 * What @fastify/swagger builds from the route schemas, finished for client generators and
 * linters: a description for every answer, the headers every answer carries, titled objects
 * and headers as shared components, discriminated unions as `oneOf`. Runs once, when the
 * document is first asked for.
 */
function finish (doc: Document): Document {
  const schemas = doc.components.schemas ??= {}
  const headers: Record<string, Json> = {}
  for (const methods of Object.values(doc.paths)) {
    for (const operation of Object.values(methods)) {
      // Routes open to anyone say so (`security: []`); the others pass auth and the rate limiter.
      const authenticated = operation.security === undefined
      for (const [status, response] of Object.entries(operation.responses ?? {})) {
        if (response.$ref !== undefined) continue
        if (response.description === undefined || response.description === 'Default Response') {
          response.description = STATUS_CODES[status] ?? 'Answer'
        }
        const all = {
          ...(authenticated ? EVERY_ANSWER : {}),
          ...(status === '429' || status === '503' ? { 'Retry-After': RETRY_AFTER } : {}),
          ...response.headers
        }
        if (Object.keys(all).length > 0) response.headers = hoistHeaders(all, headers)
      }
    }
  }
  doc.components.headers = headers
  doc.paths = hoist(doc.paths, schemas, false) as Document['paths']
  for (const schema of Object.values(schemas)) discriminate(schema, schemas)
  return doc
}

/**
 * The OpenAPI document, built from the routes registered after this plugin, and its pages at
 * /docs. The shared error schema goes in first: routes' error answers refer to it as `Error`.
 */
export const openApiPlugin = fp(async (app: FastifyInstance) => {
  app.addSchema(ErrorSchema)
  await app.register(swagger, {
    openapi: {
      openapi: '3.0.3',
      info: {
        title: 'Parley API',
        version: '2',
        description: 'Self-hosted secure messaging. Every /v2 route takes HTTP Basic auth: username = key id, password = secret.',
        license: { name: 'Proprietary: self-hosted by its operator' }
      },
      servers: [{ url: '/', description: 'This Parley server' }],
      components: { securitySchemes: { basicAuth: { type: 'http', scheme: 'basic' } } },
      security: [{ basicAuth: [] }]
    },
    refResolver: { buildLocalReference: (json, _baseUri, _fragment, i) => typeof json.$id === 'string' ? json.$id : `def-${i}` },
    transformObject: (documents) => finish(('openapiObject' in documents ? documents.openapiObject : documents.swaggerObject) as unknown as Document) as never
  })
  await app.register(swaggerUi, { routePrefix: '/docs' })
}, { name: 'openapi' })
