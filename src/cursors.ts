import { ValidationFailed } from './errors.js'

const ISO_TIME = /^(\d{4})-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/

/**
 * Whether a time inside a cursor is one this service could have written (Date#toISOString of
 * a real instant): the shape alone let `2026-02-30…` through, which Date.parse rolls over to
 * March but PostgreSQL refuses (22008, a 500), and year 0000, which JavaScript takes and
 * PostgreSQL has no such year. A time that does not round-trip, or before year 1, is refused.
 */
export function isCursorTime (text: string): boolean {
  const match = ISO_TIME.exec(text)
  if (match === null || Number(match[1]) < 1) return false
  const at = new Date(text)
  return !Number.isNaN(at.getTime()) && at.toISOString() === text
}

/** The one answer to a cursor this service did not write: 400 naming `cursor`, never a 500. */
export function invalidCursor (): ValidationFailed {
  return new ValidationFailed('cursor: not a cursor this service returned; pass nextCursor unchanged')
}

/** A keyset cursor of a list ordered by (time, id): the last row's time and id, opaque to clients. */
export interface TimeCursor { at: string, id: string }

export function encodeTimeCursor (cursor: TimeCursor): string {
  return Buffer.from(JSON.stringify([cursor.at, cursor.id])).toString('base64url')
}

/** Only what encodeTimeCursor wrote, with an id that `isId` accepts: anything else is a 400 naming cursor. */
export function decodeTimeCursor (text: string, isId: (id: string) => boolean): TimeCursor {
  try {
    const value: unknown = JSON.parse(Buffer.from(text, 'base64url').toString('utf8'))
    if (Array.isArray(value) && value.length === 2) {
      const [at, id] = value as unknown[]
      if (typeof at === 'string' && isCursorTime(at) && typeof id === 'string' && id.length <= 200 && isId(id)) return { at, id }
    }
  } catch { /* answered below */ }
  throw invalidCursor()
}
