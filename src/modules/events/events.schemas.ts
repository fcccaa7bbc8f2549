import { Type, type Static, type TSchema, type TStringOptions } from 'typebox'
import { Timestamp } from '../../schemas.js'
import { GroupSummarySchema } from '../groups/groups.schemas.js'
import { MessageSchema } from '../messages/messages.schemas.js'

/** An event id: its place in the feed (users.event_seq), as a decimal string. */
export const EVENT_ID = /^[0-9]{1,15}$/

/** The one schema of an event id, wherever the API takes or gives one; `options` add a default or say what this one is for. */
export const EventId = (options: TStringOptions = {}) => Type.String({ pattern: EVENT_ID.source, description: 'An event id: a decimal string', ...options })

/*
 * The event catalogue (API.md §4 Events, §9, §13): every type a feed holds and the shape of its
 * `data`. NewEvent (events.repository.ts) takes one of these, so tsc checks what each producer
 * writes; the OpenAPI document and the generated client describe each type from here.
 */

const Address = Type.String({ description: 'A user address' })
const MessageId = Type.String({ description: 'The message id' })
const GroupId = Type.String({ description: 'The group id' })
const TypingTo = Type.String({ description: 'The recipient: the caller\'s address, or a group id' })

/** One entry of the catalogue: the event envelope, with a `type` of its own and the `data` that type carries. */
function entry<T extends string, D extends TSchema> (type: T, title: string, data: D) {
  return Type.Object({
    id: EventId({ description: 'An event id: a decimal string, increasing within the feed' }),
    type: Type.Literal(type),
    createdAt: Timestamp,
    data
  }, { title })
}

const Catalogue = [
  // Built by the send's statement in SQL (send-batch.repository.ts), its createdAt filled in there.
  entry('message.received', 'MessageReceivedEvent', Type.Object({ message: MessageSchema })),
  // The message as it is after the edit, to every recipient that has not hidden it.
  entry('message.edited', 'MessageEditedEvent', Type.Object({ message: MessageSchema })),
  // A reaction added or taken back, to the message's sender and recipients, the reactor aside.
  entry('message.reaction', 'MessageReactionEvent', Type.Object({
    message: MessageId,
    emoji: Type.String(),
    from: Address,
    added: Type.Boolean({ description: 'true when added, false when taken back' })
  })),
  entry('message.deleted', 'MessageDeletedEvent', Type.Object({ message: MessageId })),
  entry('message.status', 'MessageStatusEvent', Type.Object({
    message: MessageId,
    recipient: Address,
    status: Type.Unsafe<'delivered' | 'read'>({ type: 'string', enum: ['delivered', 'read'] })
  })),
  // One per sender whose messages a reader marked read up to a point (POST /conversations/{peer}/read).
  entry('conversation.read', 'ConversationReadEvent', Type.Object({
    reader: Address,
    conversation: Type.String({ description: 'The conversation as the sender names it: the reader\'s address for 1:1, the group id for a group' }),
    upTo: Type.String({ description: 'Every message of the sender\'s in it up to and including this one is read' })
  })),
  entry('typing.started', 'TypingStartedEvent', Type.Object({ from: Address, to: TypingTo, expiresAt: Timestamp })),
  entry('typing.stopped', 'TypingStoppedEvent', Type.Object({ from: Address, to: TypingTo })),
  // Without the member list (API.md §13): GroupSummarySchema.
  entry('group.created', 'GroupCreatedEvent', Type.Object({ group: GroupSummarySchema })),
  entry('group.updated', 'GroupUpdatedEvent', Type.Object({ group: GroupSummarySchema })),
  entry('group.deleted', 'GroupDeletedEvent', Type.Object({ group: GroupId })),
  entry('group.members_added', 'GroupMembersAddedEvent', Type.Object({ group: GroupId, members: Type.Array(Address) })),
  entry('group.members_removed', 'GroupMembersRemovedEvent', Type.Object({ group: GroupId, members: Type.Array(Address) })),
  entry('webhook.disabled', 'WebhookDisabledEvent', Type.Object({ webhook: Type.String({ description: 'The webhook id (whk_…)' }) }))
] as const

/** Every type of event a feed holds, in the catalogue's order. */
export const EVENT_TYPES: readonly EventType[] = Catalogue.map((e) => e.properties.type.const)

/** Any event of the feed: `type` says which, and what `data` holds (the document's `oneOf` with a discriminator). */
const EventSchema = Type.Union([...Catalogue], {
  title: 'Event',
  description: 'One entry of a user\'s feed; `type` says which, and what `data` holds',
  discriminator: { propertyName: 'type' }
})

export type Event = Static<typeof EventSchema>
export type EventType = Event['type']
/** The `data` of an event of `type`. */
export type EventData<T extends EventType> = Extract<Event, { type: T }>['data']

export const ListEventsQuery = Type.Object({
  after: Type.Optional(EventId({ default: '0', description: 'Return events with a greater id; pass the `last` of the previous answer' })),
  limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 1000, default: 100 })),
  wait: Type.Optional(Type.Integer({ minimum: 0, maximum: 30, default: 0, description: 'Seconds to hold the request while there is nothing to return' }))
})

export const EventList = Type.Object({
  events: Type.Array(EventSchema),
  last: Type.String({ description: 'The id of the last event returned, or the given `after`' })
})

export const AcknowledgeEventsBody = Type.Object({
  ids: Type.Optional(Type.Array(EventId(), { maxItems: 1000, description: 'Event ids; a form repeats the field' })),
  upTo: Type.Optional(EventId())
})

export const DeleteEventsQuery = Type.Object({
  upTo: Type.Optional(EventId())
})
