import swagger from '@fastify/swagger'
import swaggerUi from '@fastify/swagger-ui'
import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import { polishOpenApi } from '../openapi.js'
import { ErrorSchema } from '../schemas.js'

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
        description: 'Self-hosted secure messaging. Every /v2 route takes HTTP Basic auth: username = key id, password = secret.'
      },
      components: { securitySchemes: { basicAuth: { type: 'http', scheme: 'basic' } } },
      security: [{ basicAuth: [] }]
    },
    refResolver: { buildLocalReference: (json, _baseUri, _fragment, i) => typeof json.$id === 'string' ? json.$id : `def-${i}` },
    transformObject: (documents) => polishOpenApi('openapiObject' in documents ? documents.openapiObject : documents.swaggerObject) as never
  })
  await app.register(swaggerUi, { routePrefix: '/docs' })
}, { name: 'openapi' })
