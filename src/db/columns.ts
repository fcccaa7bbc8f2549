import { timestamp } from 'drizzle-orm/pg-core'

/** Every stored time: UTC, millisecond precision, read back as a Date. */
export const timestamptz = (name: string) => timestamp(name, { withTimezone: true, precision: 3, mode: 'date' })
