import { Type, type Static } from 'typebox'
import { AddressParam, Timestamp } from '../../schemas.js'
import { RetentionDays } from '../groups/groups.schemas.js'

export const UserSchema = Type.Object({
  address: Type.String({ description: 'The user address, lower-case' }),
  displayName: Type.Union([Type.String(), Type.Null()], { description: 'A name for people, if set' }),
  bot: Type.Boolean({ description: 'True for automated users such as the test bot' }),
  createdAt: Timestamp
}, { title: 'User', description: 'A user of the platform' })

export type User = Static<typeof UserSchema>

/** Where an erasure of the user stands (DELETE /admin/users/{user}); null: none was asked for. */
export type ErasureState = 'pending' | 'done'

/** A user as the admin API shows it: with whether an operator deactivated it, and whether it is erased. */
export const AdminUserSchema = Type.Object({
  ...UserSchema.properties,
  deactivatedAt: Type.Union([Timestamp, Type.Null()], { description: 'When an operator deactivated the user; null while active' }),
  erasure: Type.Union([Type.Literal('pending'), Type.Literal('done'), Type.Null()], {
    description: 'Erasure (DELETE /admin/users/{user}): pending while its data is being removed in the background, done once ' +
      'nothing of it is left but this row, which keeps the address reserved; null when no erasure was asked for'
  })
}, { title: 'AdminUser' })

export type AdminUser = Static<typeof AdminUserSchema>

export const UserParams = Type.Object({ user: AddressParam })

export const WhoamiSchema = Type.Object({
  user: UserSchema,
  key: Type.Object({
    id: Type.String({ description: 'The API key the request was made with' }),
    scopes: Type.Array(Type.String(), { description: 'read, send, admin' }),
    dailyQuota: Type.Integer({ description: 'Messages this key may send per UTC day' }),
    expiresAt: Type.Union([Timestamp, Type.Null()]),
    lastUsedAt: Type.Union([Timestamp, Type.Null()], { description: 'Recorded at most once a minute' })
  }),
  keyId: Type.String({ description: 'Same as key.id (kept for clients written before key)' }),
  dailyQuota: Type.Integer({ description: 'Same as key.dailyQuota (kept for clients written before key)' }),
  retentionDays: Type.Union([RetentionDays, Type.Null()], {
    description: 'Days a message is kept before it is purged (MESSAGE_RETENTION_DAYS); null: until deleted. A group may keep its ' +
      'messages for less: its effectiveRetentionDays'
  })
}, { title: 'Whoami' })
