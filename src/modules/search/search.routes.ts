import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import type { Reads } from '../../db/replica.js'
import { principalOf } from '../../plugins/auth.js'
import { arrivalOf } from '../../plugins/read-replica.js'
import { AUTHENTICATED_ERRORS, errorResponses } from '../../schemas.js'
import { SearchBody, SearchResults } from './search.schemas.js'
import { search } from './search.service.js'

export const searchRoutes: FastifyPluginAsyncTypebox<{ reads: Reads, messageRetentionDays: number | undefined }> = async (app, { reads, messageRetentionDays }) => {
  app.post('/search', {
    config: { admission: 'heavy' },
    schema: {
      operationId: 'search',
      tags: ['search'],
      summary: 'Search messages, users and groups',
      description: 'Messages the caller may read whose body has every word of the query as a word prefix (a word is a run of ' +
        'letters and digits; prefixes count from 2 characters, a one-character word matches itself; matched by keyed hashes, the ' +
        'words are never stored), newest first; users whose address or display name contains the query; the caller\'s groups whose name contains ' +
        'it. `with` restricts messages to one conversation, and without a query lists it. A page holds at most `limit` results and ' +
        'about 1 MiB of them. A query word past 12 characters is looked up by its first 12 and each candidate checked whole, ' +
        'a bounded number a page, so a page may be short or empty while more follow: page on with nextCursor until it is null.',
      body: SearchBody,
      response: { 200: SearchResults, ...errorResponses(...AUTHENTICATED_ERRORS, 403, 404) }
    }
  }, async (req, reply) => search(reads, {
    viewer: principalOf(req).address,
    query: req.body.query,
    types: req.body.types,
    with: req.body.with,
    limit: req.body.limit ?? 50,
    cursor: req.body.cursor,
    messageRetentionDays
  }, { arrivedAt: arrivalOf(reply) }))
}
