import type { FastifyRequest } from 'fastify'
import type { Db } from '../../db/client.js'
import { transaction } from '../../db/transaction.js'
import { principalOf } from '../../plugins/auth.js'
import { createAuditRepository, type NewAuditEntry } from './audit.repository.js'
import type { AuditAction } from './audit.schemas.js'

/** Who is acting, and from where: what every entry of one request (or CLI command) shares. */
export type AuditSource = Omit<NewAuditEntry, 'action' | 'target'>

/** The operator CLI: no key, no request, no address. */
export const CLI_SOURCE: AuditSource = { actor: 'cli', requestId: null, ip: null }

/** The key that made this (authenticated) request, its request id and the client's address. */
export function requestSource (req: FastifyRequest): AuditSource {
  const { keyId, address } = principalOf(req)
  return { actor: { key: keyId, address }, requestId: req.id, ip: req.ip }
}

export type RecordAudit = (action: AuditAction, target: string) => Promise<void>

/**
 * Runs a change in one transaction with the audit entries it records (`record`, after the
 * change succeeded): both commit, or neither, so a failed change leaves no entry and a
 * committed one always has its entry. `work` may run more than once (transaction()).
 */
export async function audited<T> (db: Db, source: AuditSource, work: (tx: Db, record: RecordAudit) => Promise<T>): Promise<T> {
  return transaction(db, async (tx) => {
    const log = createAuditRepository(tx)
    return work(tx, (action, target) => log.record({ ...source, action, target }))
  })
}

/** The entries a change to a user makes: a rename and a (de/re)activation are each recorded. */
export function userChangeActions (changes: { displayName?: string | null, deactivated?: boolean }): AuditAction[] {
  const actions: AuditAction[] = []
  if (changes.displayName !== undefined) actions.push('user.update')
  if (changes.deactivated === true) actions.push('user.deactivate')
  if (changes.deactivated === false) actions.push('user.reactivate')
  return actions
}
