import { Type } from 'typebox'
import { AddressParam, nullable, Timestamp } from '../../schemas.js'
import { KeySchema, ScopeSchema } from '../keys/keys.schemas.js'
import { AdminUserSchema } from '../users/users.schemas.js'

const DisplayName = Type.String({ minLength: 1, maxLength: 100, description: 'A name for people' })
const DailyQuota = Type.Integer({ minimum: 0, maximum: 1_000_000_000, description: 'Messages per UTC day' })
const Scopes = Type.Array(ScopeSchema, { minItems: 1, maxItems: 3, description: 'Default: read and send' })

// Ajv coerces types in the order a union lists them, so null comes first: else null became 0 or "".
export const CreateUserBody = Type.Object({
  address: AddressParam,
  displayName: Type.Optional(DisplayName)
}, { additionalProperties: false })

export const UpdateUserBody = Type.Object({
  displayName: Type.Optional(Type.Union([Type.Null(), DisplayName], { description: 'null clears it' })),
  deactivated: Type.Optional(Type.Boolean({ description: 'true: the user\'s keys answer 401 and it receives nothing; false restores both' }))
}, { additionalProperties: false })

export const ListUsersQuery = Type.Object({
  limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 200, default: 50 })),
  cursor: Type.Optional(Type.String({ minLength: 1, maxLength: 200, description: 'nextCursor of the previous page' })),
  query: Type.Optional(Type.String({ minLength: 1, maxLength: 200, description: 'Address or display name contains this' }))
}, { additionalProperties: false })

export const UserList = Type.Object({
  users: Type.Array(AdminUserSchema),
  nextCursor: Type.Union([Type.String(), Type.Null()])
}, { title: 'UserList' })

export const AdminUserParams = Type.Object({ user: AddressParam })

export const CreateKeyBody = Type.Object({
  address: AddressParam,
  scopes: Type.Optional(Scopes),
  dailyQuota: Type.Optional(DailyQuota),
  expiresAt: Type.Optional(Timestamp)
}, { additionalProperties: false })

export const UpdateKeyBody = Type.Object({
  scopes: Type.Optional(Scopes),
  dailyQuota: Type.Optional(nullable(DailyQuota, 'Messages per UTC day; null: back to the configured default')),
  expiresAt: Type.Optional(nullable(Timestamp, 'ISO 8601 UTC; null: never'))
}, { additionalProperties: false })

export const KeyParams = Type.Object({
  keyId: Type.String({ pattern: '^key_[0-9a-z]{26}$', description: 'A key id (key_…)' })
})

export const ListKeysQuery = Type.Object({
  address: Type.Optional(AddressParam),
  limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 200, default: 50 })),
  cursor: Type.Optional(Type.String({ minLength: 1, maxLength: 200, description: 'nextCursor of the previous page' }))
}, { additionalProperties: false })

export const KeyList = Type.Object({
  keys: Type.Array(KeySchema, { description: 'Oldest first: one page of at most `limit` keys' }),
  nextCursor: Type.Union([Type.String(), Type.Null()], { description: 'Pass as cursor for the next page; null on the last' })
}, { title: 'KeyList' })

export const CreatedKeySchema = Type.Object({
  ...KeySchema.properties,
  secret: Type.String({ description: 'The secret, shown only in this answer: the password of HTTP Basic auth' })
}, { title: 'CreatedKey' })
