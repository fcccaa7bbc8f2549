import { Type, type Static } from 'typebox'
import { Timestamp } from '../../schemas.js'

const EventId = Type.String({ pattern: '^[0-9]{1,15}$', description: 'An event id: a decimal string' })

const EventSchema = Type.Object({
  id: EventId,
  type: Type.String({ description: 'message.received, message.deleted, message.status, typing.started, typing.stopped, group.*' }),
  createdAt: Timestamp,
  data: Type.Unknown({ description: 'Depends on the type (API.md §4 Events)' })
}, { title: 'Event' })

export type Event = Static<typeof EventSchema>

export const ListEventsQuery = Type.Object({
  after: Type.Optional(Type.String({ pattern: '^[0-9]{1,15}$', default: '0', description: 'Return events with a greater id; pass the `last` of the previous answer' })),
  limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 1000, default: 100 })),
  wait: Type.Optional(Type.Integer({ minimum: 0, maximum: 30, default: 0, description: 'Seconds to hold the request while there is nothing to return' }))
})

export const EventList = Type.Object({
  events: Type.Array(EventSchema),
  last: Type.String({ description: 'The id of the last event returned, or the given `after`' })
})

export const AcknowledgeEventsBody = Type.Object({
  ids: Type.Optional(Type.Array(EventId, { maxItems: 1000, description: 'Event ids; a form repeats the field' })),
  upTo: Type.Optional(EventId)
})

export const DeleteEventsQuery = Type.Object({
  upTo: Type.Optional(EventId)
})
