import { Type, type Static } from 'typebox'
import { Timestamp } from '../../schemas.js'
import { SCOPES } from '../../scopes.js'

export const ScopeSchema = Type.Union(SCOPES.map((s) => Type.Literal(s)), {
  description: 'read: every GET and the reads that are POSTs; send: every other write outside /admin; admin: /admin'
})

export const KeySchema = Type.Object({
  keyId: Type.String({ description: 'The key id: the username of HTTP Basic auth' }),
  address: Type.String({ description: 'The user the key acts as' }),
  scopes: Type.Array(ScopeSchema),
  dailyQuota: Type.Union([Type.Integer(), Type.Null()], { description: 'Messages per UTC day; null: the configured default' }),
  expiresAt: Type.Union([Timestamp, Type.Null()], { description: 'After this the key answers 401; null: never' }),
  lastUsedAt: Type.Union([Timestamp, Type.Null()], { description: 'When the key last authenticated (recorded at most once a minute)' }),
  createdAt: Timestamp,
  revokedAt: Type.Union([Timestamp, Type.Null()])
}, { title: 'Key', description: 'An API key, never with its secret' })

export type Key = Static<typeof KeySchema>

/** Whether `text` has the shape of a key id (key_ and 26 of base32), as KeyParams' pattern checks it. */
export function isKeyId (text: string): boolean {
  return /^key_[0-9a-z]{26}$/.test(text)
}
