import { Type, type Static } from 'typebox'
import { GroupSchema } from '../groups/groups.schemas.js'
import { MessageSchema } from '../messages/messages.schemas.js'
import { UserSchema } from '../users/users.schemas.js'

export const SEARCH_TYPES = ['messages', 'users', 'groups'] as const
export type SearchType = typeof SEARCH_TYPES[number]

export const SearchBody = Type.Object({
  query: Type.Optional(Type.String({ minLength: 1, maxLength: 200, description: 'Every word must occur (as a word prefix for messages); optional when `with` is given' })),
  types: Type.Optional(Type.Array(Type.Union(SEARCH_TYPES.map((t) => Type.Literal(t))), { minItems: 1, maxItems: 3, description: 'Default: all three' })),
  with: Type.Optional(Type.String({ minLength: 1, maxLength: 100, description: 'A user address or group id: only messages of that conversation' })),
  limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 200, default: 50 })),
  cursor: Type.Optional(Type.String({ maxLength: 1000, description: 'The nextCursor of the previous page' }))
})

export const SearchResults = Type.Object({
  results: Type.Array(Type.Union([
    Type.Object({ type: Type.Literal('message'), message: MessageSchema }),
    Type.Object({ type: Type.Literal('user'), user: UserSchema }),
    Type.Object({ type: Type.Literal('group'), group: GroupSchema })
  ])),
  nextCursor: Type.Union([Type.String(), Type.Null()], { description: 'null on the last page' })
}, { description: 'Messages newest first, then users by address, then groups by name' })

export type SearchResult = Static<typeof SearchResults>['results'][number]
