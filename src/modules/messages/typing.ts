import type { Db } from '../../db/client.js'
import { createEventsRepository } from '../events/events.repository.js'
import { resolveRecipients } from './send-message.js'

/** How long a typing.started holds before it lapses. */
export const TYPING_TTL_MS = 15_000

/** typing.started to the recipient (or each other member of a group), lapsing after 15 s. */
export async function startTyping (db: Db, from: string, to: string): Promise<void> {
  await db.transaction(async (tx) => {
    const target = await resolveRecipients(tx, from, to)
    const expiresAt = new Date(Date.now() + TYPING_TTL_MS)
    await createEventsRepository(tx).append(target.addresses.map((address) => ({
      address, type: 'typing.started', data: { from, to: target.recipient, expiresAt: expiresAt.toISOString() }, expiresAt
    })))
  })
}

export async function stopTyping (db: Db, from: string, to: string): Promise<void> {
  await db.transaction(async (tx) => {
    const target = await resolveRecipients(tx, from, to)
    await createEventsRepository(tx).append(target.addresses.map((address) => ({
      address, type: 'typing.stopped', data: { from, to: target.recipient }
    })))
  })
}
