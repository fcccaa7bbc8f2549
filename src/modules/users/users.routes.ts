import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import type { Db } from '../../db/client.js'
import { NotFound } from '../../errors.js'
import { AUTHENTICATED_ERRORS, errorResponses } from '../../schemas.js'
import { createUsersRepository } from './users.repository.js'
import { toUser, UserParams, UserSchema } from './users.schemas.js'

export const usersRoutes: FastifyPluginAsyncTypebox<{ db: Db }> = async (app, { db }) => {
  const users = createUsersRepository(db)

  app.get('/user/:user', {
    schema: {
      tags: ['users'],
      summary: 'Look a user up by address',
      description: 'Any authenticated key may look any user up.',
      params: UserParams,
      response: { 200: UserSchema, ...errorResponses(...AUTHENTICATED_ERRORS, 404) }
    }
  }, async (req) => {
    const row = await users.find(req.params.user)
    if (row === undefined) throw new NotFound('user', req.params.user.toLowerCase())
    return toUser(row)
  })
}
