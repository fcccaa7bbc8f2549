import { Type, type Static } from 'typebox'
import { AddressParam, Timestamp } from '../../schemas.js'
import type { UserRow } from './users.table.js'

export const UserSchema = Type.Object({
  address: Type.String({ description: 'The user address, lower-case' }),
  displayName: Type.Union([Type.String(), Type.Null()], { description: 'A name for people, if set' }),
  bot: Type.Boolean({ description: 'True for automated users such as the test bot' }),
  createdAt: Timestamp
}, { title: 'User', description: 'A user of the platform' })

export type User = Static<typeof UserSchema>

export const UserParams = Type.Object({ user: AddressParam })

export function toUser (row: UserRow): User {
  return { address: row.address, displayName: row.displayName, bot: row.bot, createdAt: row.createdAt.toISOString() }
}

export const WhoamiSchema = Type.Object({
  user: UserSchema,
  keyId: Type.String({ description: 'The API key the request was made with' }),
  dailyQuota: Type.Integer({ description: 'Messages this key may send per UTC day' })
}, { title: 'Whoami' })
