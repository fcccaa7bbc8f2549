import { Type, type Static } from 'typebox'
import { Timestamp } from '../../schemas.js'

export const RosterEntrySchema = Type.Object({
  entity: Type.String({ description: 'A user address or a group id' }),
  type: Type.Union([Type.Literal('user'), Type.Literal('group')]),
  name: Type.Union([Type.String(), Type.Null()], { description: 'The caller\'s own name for the contact' }),
  addedAt: Timestamp
}, { title: 'RosterEntry' })

export type RosterEntry = Static<typeof RosterEntrySchema>

export const RosterSchema = Type.Object({
  entries: Type.Array(RosterEntrySchema, { description: 'Oldest first: one page of at most `limit` entries' }),
  nextCursor: Type.Union([Type.String(), Type.Null()], { description: 'Pass as cursor for the next page; null on the last' })
})

export const ListRosterQuery = Type.Object({
  limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 200, default: 50 })),
  cursor: Type.Optional(Type.String({ minLength: 1, maxLength: 400, description: 'nextCursor of the previous page' }))
}, { additionalProperties: false })

export const AddRosterEntryBody = Type.Object({
  entity: Type.String({ minLength: 1, maxLength: 100, description: 'A user address or a group id (grp_…)' }),
  name: Type.Optional(Type.String({ maxLength: 100 }))
})

export const RosterParams = Type.Object({ entity: Type.String({ minLength: 1, maxLength: 100 }) })
