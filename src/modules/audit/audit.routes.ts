import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import { invalidCursor } from '../../cursors.js'
import type { Db } from '../../db/client.js'
import { AUTHENTICATED_ERRORS, errorResponses } from '../../schemas.js'
import { createAuditRepository, toAuditEntry } from './audit.repository.js'
import { AuditList, ListAuditQuery } from './audit.schemas.js'

/** The cursor is the last entry's id, opaque to clients. */
const encodeCursor = (id: number): string => Buffer.from(String(id)).toString('base64url')

function decodeCursor (text: string): number {
  const id = Buffer.from(text, 'base64url').toString('utf8')
  if (!/^[1-9][0-9]{0,15}$/.test(id)) throw invalidCursor()
  return Number(id)
}

/**
 * GET /admin/audit (API.md §14): the audit log, read-only. Nothing in the API changes or
 * deletes an entry; retention (AUDIT_RETENTION_DAYS) is the only thing that removes one.
 */
export const auditRoutes: FastifyPluginAsyncTypebox<{ db: Db }> = async (app, { db }) => {
  const log = createAuditRepository(db)

  app.get('/admin/audit', {
    schema: {
      operationId: 'adminListAudit',
      tags: ['admin'],
      summary: 'Read the audit log',
      description: 'Every admin action and key change (user create, update, deactivate, reactivate; key create, update, revoke; ' +
        'webhook create and delete), by the API or the operator CLI, written in the same transaction as the change. Newest first, ' +
        'cursor-paged; `actor` (a key id, a user address, or `cli`), `action` and `target` keep the entries that match. ' +
        'Entries cannot be changed or deleted through the API; they are kept AUDIT_RETENTION_DAYS days (default 365).',
      querystring: ListAuditQuery,
      response: { 200: AuditList, ...errorResponses(...AUTHENTICATED_ERRORS, 403) }
    }
  }, async (req) => {
    const limit = req.query.limit ?? 50
    const before = req.query.cursor === undefined ? undefined : decodeCursor(req.query.cursor)
    const rows = await log.page({ actor: req.query.actor, action: req.query.action, target: req.query.target }, before, limit + 1)
    const page = rows.slice(0, limit)
    return {
      entries: page.map(toAuditEntry),
      nextCursor: rows.length > limit ? encodeCursor(page.at(-1)!.id) : null
    }
  })
}
