import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'

/** Every answer carries its request's id (the client's own when `genReqId` kept it), so a report can quote it. */
export const requestIdPlugin = fp(async (app: FastifyInstance) => {
  app.addHook('onRequest', async (req, reply) => {
    reply.header('x-request-id', req.id)
  })
}, { name: 'request-id' })
