import { Type, type Static } from 'typebox'
import { GROUP_ID_PATTERN } from '../../ids.js'
import { AddressParam, nullable, Timestamp } from '../../schemas.js'

/** A number of days a message is kept: 1 to 100 years. */
export const RetentionDays = Type.Integer({ minimum: 1, maximum: 36_500 })

export const GroupSchema = Type.Object({
  id: Type.String({ description: 'grp_…' }),
  name: Type.String(),
  owner: Type.String({ description: 'Address of the owner' }),
  members: Type.Array(Type.String(), { description: 'Addresses, the owner included' }),
  retentionDays: Type.Union([RetentionDays, Type.Null()], {
    description: 'Days this group\'s messages are kept, as its owner set it; null: none of its own'
  }),
  effectiveRetentionDays: Type.Union([RetentionDays, Type.Null()], {
    description: 'Days this group\'s messages are kept before they are purged: the shorter of retentionDays and the ' +
      'service\'s (GET /whoami retentionDays); null: kept until deleted'
  }),
  createdAt: Timestamp,
  updatedAt: Timestamp
}, { title: 'Group' })

export type Group = Static<typeof GroupSchema>

/** A group as stored: what applies to it besides (effectiveRetentionDays) depends on the service's setting. */
export type StoredGroup = Omit<Group, 'effectiveRetentionDays'>

/**
 * A group as group.created and group.updated carry it (API.md §13): without its member list,
 * so a change to a 1,000-member group writes 1,000 small events, not 1,000 copies of 1,000
 * addresses. GET /group/{id} gives the members.
 */
export const GroupSummarySchema = Type.Object({
  id: Type.String({ description: 'grp_…' }),
  name: Type.String(),
  owner: Type.String({ description: 'Address of the owner' }),
  memberCount: Type.Integer({ minimum: 1, description: 'Members, the owner included' }),
  createdAt: Timestamp
}, { title: 'GroupSummary' })

export type GroupSummary = Static<typeof GroupSummarySchema>

export const GroupParams = Type.Object({
  group: Type.String({ pattern: GROUP_ID_PATTERN, description: 'A group id (grp_…)' })
})

const GroupName = Type.String({ minLength: 1, maxLength: 100, description: '1-100 characters' })
const Members = Type.Array(AddressParam, { maxItems: 1000, description: 'Addresses; a form repeats the field' })

export const CreateGroupBody = Type.Object({
  name: GroupName,
  members: Type.Optional(Members)
})

export const UpdateGroupBody = Type.Object({
  name: Type.Optional(GroupName),
  retentionDays: Type.Optional(nullable(RetentionDays, 'Days the group\'s messages are kept (1-36500), when shorter than the service\'s MESSAGE_RETENTION_DAYS; null clears it'))
})

export const MembersBody = Type.Object({ members: Type.Array(AddressParam, { minItems: 1, maxItems: 1000 }) })
