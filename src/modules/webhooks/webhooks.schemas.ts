import { Type, type Static } from 'typebox'
import { AddressParam, Timestamp } from '../../schemas.js'
import { EVENT_TYPES, EventId } from '../events/events.schemas.js'

const WebhookId = Type.String({ pattern: '^whk_[0-9a-z]{26}$', description: 'A webhook id (whk_…)' })
const EventTypes = Type.Array(Type.Unsafe<string>({ type: 'string', enum: [...EVENT_TYPES] }), {
  minItems: 1, maxItems: EVENT_TYPES.length, uniqueItems: true, description: 'Event types to deliver; omitted or null for every type but typing.* (list typing.started and typing.stopped to get them)'
})

const WebhookSchema = Type.Object({
  id: WebhookId,
  url: Type.String(),
  events: Type.Union([EventTypes, Type.Null()]),
  createdAt: Timestamp,
  disabledAt: Type.Union([Timestamp, Type.Null()], { description: 'Set when deliveries kept failing for 24 h, or when the key that registered it was revoked; null while active' })
}, { title: 'Webhook' })

export type Webhook = Static<typeof WebhookSchema>

/** A webhook as an operator sees it: whose, and which key registered it. */
const AdminWebhookSchema = Type.Object({
  ...WebhookSchema.properties,
  address: Type.String({ description: 'The user whose feed it delivers' }),
  keyId: Type.Union([Type.String(), Type.Null()], {
    description: 'The key that registered it: it delivers only while that key is accepted. Null for a webhook registered before keys were recorded, which delivers while any read key of its user is accepted'
  })
}, { title: 'AdminWebhook' })

export type AdminWebhook = Static<typeof AdminWebhookSchema>

export const AdminWebhookList = Type.Object({
  webhooks: Type.Array(AdminWebhookSchema),
  nextCursor: Type.Union([Type.String(), Type.Null()])
}, { title: 'AdminWebhookList' })

export const AdminWebhooksQuery = Type.Object({
  limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 200, default: 50 })),
  cursor: Type.Optional(Type.String({ pattern: '^whk_[0-9a-z]{26}$', description: 'The nextCursor of the previous page' }))
}, { additionalProperties: false })

export const CreatedWebhookSchema = Type.Object({
  ...WebhookSchema.properties,
  secret: Type.String({ description: 'The signing secret (whsec_…): shown only here' })
}, { title: 'CreatedWebhook' })

export const CreateWebhookBody = Type.Object({
  url: Type.String({ minLength: 1, maxLength: 2048, description: 'https:// (http:// too with WEBHOOK_ALLOW_PRIVATE=true); not a private, loopback or link-local address' }),
  events: Type.Optional(Type.Union([EventTypes, Type.Null()]))
})

export const WebhookListSchema = Type.Object({ webhooks: Type.Array(WebhookSchema) })

export const WebhookParams = Type.Object({ id: WebhookId })

export const AdminWebhookParams = Type.Object({
  user: AddressParam,
  id: WebhookId
})

export const AdminWebhooksParams = Type.Object({ user: AddressParam })

const DeliverySchema = Type.Object({
  event: EventId(),
  status: Type.Union([Type.Literal('pending'), Type.Literal('delivered'), Type.Literal('failed')]),
  attempts: Type.Integer({ minimum: 0 }),
  lastError: Type.Union([Type.String(), Type.Null()]),
  lastAttemptAt: Type.Union([Timestamp, Type.Null()])
}, { title: 'WebhookDelivery' })

export type WebhookDelivery = Static<typeof DeliverySchema>

export const DeliveriesQuery = Type.Object({
  limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 200, default: 50 })),
  cursor: Type.Optional(EventId({ description: 'The nextCursor of the previous page' }))
})

export const DeliveryListSchema = Type.Object({
  deliveries: Type.Array(DeliverySchema),
  nextCursor: Type.Union([Type.String(), Type.Null()])
})

export const RedeliverBody = Type.Object({ event: EventId() })
