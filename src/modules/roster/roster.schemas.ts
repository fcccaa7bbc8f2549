import { Type, type Static } from 'typebox'
import { Timestamp } from '../../schemas.js'

export const RosterEntrySchema = Type.Object({
  entity: Type.String({ description: 'A user address or a group id' }),
  type: Type.Union([Type.Literal('user'), Type.Literal('group')]),
  name: Type.Union([Type.String(), Type.Null()], { description: 'The caller\'s own name for the contact' }),
  addedAt: Timestamp
}, { title: 'RosterEntry' })

export type RosterEntry = Static<typeof RosterEntrySchema>

export const RosterSchema = Type.Object({ entries: Type.Array(RosterEntrySchema) })

export const AddRosterEntryBody = Type.Object({
  entity: Type.String({ minLength: 1, maxLength: 100, description: 'A user address or a group id (grp_…)' }),
  name: Type.Optional(Type.String({ maxLength: 100 }))
})

export const RosterParams = Type.Object({ entity: Type.String({ minLength: 1, maxLength: 100 }) })
