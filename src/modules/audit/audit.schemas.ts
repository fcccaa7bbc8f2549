import { Type, type Static } from 'typebox'
import { AddressParam, Timestamp } from '../../schemas.js'

/**
 * Every action the audit log records: the one list, so an action added later is added here and
 * the API's schema, the CLI and the column's type follow.
 */
export const AUDIT_ACTIONS = [
  'user.create', 'user.update', 'user.deactivate', 'user.reactivate', 'user.erase',
  'key.create', 'key.update', 'key.revoke',
  'webhook.create', 'webhook.delete',
  'user.export'
] as const

export type AuditAction = typeof AUDIT_ACTIONS[number]

// An enum (as ErrorSchema's code): a union of literals built from a list has no static type.
const AuditActionSchema = Type.Unsafe<AuditAction>({
  type: 'string',
  enum: [...AUDIT_ACTIONS],
  description: 'What was done: user.create, user.update (display name), user.deactivate, user.reactivate, user.erase ' +
    '(an erasure asked for; each request is recorded, the first one starts it), key.create, ' +
    'key.update (scopes, daily quota or expiry), key.revoke, webhook.create, webhook.delete, user.export (an export of the ' +
    'user\'s data was started, by the user itself or by an admin)'
})

export const isAuditAction = (text: string): text is AuditAction => (AUDIT_ACTIONS as readonly string[]).includes(text)

/** Who acted: an API key (and the user it acts as), or the operator's CLI. */
const AuditActorSchema = Type.Union([
  Type.Object({
    key: Type.String({ description: 'The key id that made the request' }),
    address: Type.String({ description: 'The user that key acts as' })
  }),
  Type.Literal('cli', { description: 'The operator CLI (`parley`), which has no key' })
])

export type AuditActor = Static<typeof AuditActorSchema>

const AuditEntrySchema = Type.Object({
  id: Type.String({ description: 'The entry id: a decimal string, larger for later entries' }),
  at: Timestamp,
  actor: AuditActorSchema,
  action: AuditActionSchema,
  target: Type.String({ description: 'What was acted on: a user address, a key id (key_…) or a webhook id (whk_…)' }),
  requestId: Type.Union([Type.String(), Type.Null()], { description: 'The X-Request-Id of the request; null for the CLI' }),
  ip: Type.Union([Type.String(), Type.Null()], { description: 'The client\'s IP address (as TRUST_PROXY reads it); null for the CLI' })
}, { title: 'AuditEntry', description: 'One admin action or key change; never a secret' })

export type AuditEntry = Static<typeof AuditEntrySchema>

export const ListAuditQuery = Type.Object({
  limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 200, default: 50 })),
  cursor: Type.Optional(Type.String({ minLength: 1, maxLength: 200, description: 'nextCursor of the previous page' })),
  actor: Type.Optional(Type.Union([
    Type.String({ pattern: '^key_[0-9a-z]{26}$', description: 'A key id: what that key did' }),
    AddressParam
  ], { description: 'A key id (key_…), a user address (what any of its keys did), or `cli` (what the operator CLI did)' })),
  action: Type.Optional(AuditActionSchema),
  target: Type.Optional(Type.String({ minLength: 1, maxLength: 200, description: 'A user address, key id or webhook id' }))
}, { additionalProperties: false })

export const AuditList = Type.Object({
  entries: Type.Array(AuditEntrySchema, { description: 'Newest first: one page of at most `limit` entries' }),
  nextCursor: Type.Union([Type.String(), Type.Null()], { description: 'Pass as cursor for the next page; null on the last' })
}, { title: 'AuditList' })
