/** The API's objects, from the client generated from the OpenAPI document (src/client). */
export type { DeliveryStatus, Event as FeedEvent, Message } from '../../src/client/index.js'
