import { Type, type Static, type TSchema } from 'typebox'
import { ERROR_CODES, type ErrorCode } from './errors.js'

/** Shared wire schemas: the error body every non-2xx answer carries, and common fields. */
export const ErrorSchema = Type.Object({
  statusCode: Type.Integer({ description: 'The HTTP status, repeated' }),
  error: Type.String({ description: 'The HTTP reason phrase' }),
  message: Type.String({ description: 'For people: names the field or thing at fault' }),
  code: Type.Unsafe<ErrorCode>({ type: 'string', enum: [...ERROR_CODES], description: 'Stable for programs' })
}, { $id: 'Error', description: 'Every error answer' })

export const errorResponses = (...statuses: number[]) =>
  Object.fromEntries(statuses.map((status) => [status, Type.Ref('Error')]))

/** What every authenticated route may answer besides its own outcomes. */
export const AUTHENTICATED_ERRORS = [400, 401, 429, 503] as const

export const Timestamp = Type.String({ format: 'date-time', description: 'ISO 8601 UTC with milliseconds' })

/** An address as a client may write it: any case; the service compares lower-case. */
export const AddressParam = Type.String({
  pattern: '^[A-Za-z0-9][A-Za-z0-9.@+-]{0,63}$',
  description: 'A user address: 1-64 characters of a-z 0-9 . @ + -, starting with a letter or digit; case-insensitive'
})

/** A 204 answer: nothing in the body. */
/**
 * A request field that takes `schema`'s values or null, as one schema (`nullable`), not a union
 * with null: Ajv coerces inside a union's branches, so `0` (or `false`, or `""`) met the null
 * branch and became null — an admin's daily quota of 0 became "the default".
 */
export function nullable<T extends TSchema> (schema: T, description: string) {
  return Type.Unsafe<Static<T> | null>({ ...schema, nullable: true, description })
}

export const NoContent = Type.Unsafe<undefined>({ type: 'null', description: 'No content' })

/**
 * `schema` as a response that also names the headers its answer carries: the OpenAPI document
 * lists them (Fastify's serializer ignores `headers`). Each header schema's title is its name
 * under components.headers; the headers every answer carries are the OpenAPI plugin's.
 */
export function withHeaders<T extends TSchema> (schema: T, headers: Record<string, TSchema>): T {
  // A copy, so the schema stays as it is elsewhere, with TypeBox's own (non-enumerable) marks.
  return Object.defineProperties({ headers }, Object.getOwnPropertyDescriptors(schema)) as unknown as T
}
