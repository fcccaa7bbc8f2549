import { Type, type Static } from 'typebox'
import { Timestamp } from '../../schemas.js'

export const MetadataSchema = Type.Object({
  entity: Type.String(),
  metadata: Type.Record(Type.String(), Type.Unknown(), { description: 'Key → JSON value' }),
  updatedAt: Type.Union([Timestamp, Type.Null()], { description: 'null while the map was never written' })
}, { title: 'Metadata' })

/** One entity's map, as the API answers it. */
export type Metadata = Static<typeof MetadataSchema>

export const EntityParams = Type.Object({
  entity: Type.String({ minLength: 1, maxLength: 100, description: 'A user address, a group id or a message id' })
})

export const MetadataPatch = Type.Record(Type.String(), Type.Unknown(), {
  description: 'Keys (1-64 of A-Za-z0-9._-) to JSON values, merged into the map; null deletes a key. Form fields give strings.'
})
