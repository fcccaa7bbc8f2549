import type { Db } from '../../db/client.js'
import { transaction } from '../../db/transaction.js'
import { Forbidden, NotFound, ValidationFailed } from '../../errors.js'
import { createEventsRepository } from '../events/events.repository.js'
import { readableMessage } from './access.service.js'
import { createIdempotencyRepository, requestTag, sameRequest } from './idempotency.repository.js'
import { createMessagesRepository } from './messages.repository.js'
import type { Message } from './messages.schemas.js'
import { IdempotencyMismatch } from './send.errors.js'

export interface EditInput {
  id: string
  editor: string
  /** The API key editing: an Idempotency-Key is its own. */
  keyId: string
  body: string
  /** MESSAGE_EDIT_WINDOW_SECONDS: how long after sending the sender may edit. */
  windowSeconds: number
  idempotencyKey?: string | undefined
}

export interface EditResult {
  message: Message
  /** True when this answered an earlier edit with the same Idempotency-Key, changing nothing. */
  replayed: boolean
}

/**
 * PATCH /message/{id}: the sender replaces the body, within the edit window, in one transaction
 * with a message.edited event to every recipient that has not hidden it (search then finds the
 * new words only: its index is computed from the body). The message's row is locked first, so of
 * racing edits the last to commit is the body that stays, and each one's event follows the one
 * before it in every feed. An edit racing a delete either comes first (and its events go with
 * the message) or finds the message gone (404). With an Idempotency-Key, a repeat within 24 h
 * answers the message as it is now and sends nothing; the same key with another body is 422.
 */
export async function editMessage (db: Db, input: EditInput): Promise<EditResult> {
  const key = input.idempotencyKey === undefined ? undefined : { keyId: input.keyId, idempotencyKey: input.idempotencyKey }
  // What makes two edits the same edit; only its keyed tag is stored.
  const request = JSON.stringify({ edit: input.id, body: input.body })
  return transaction(db, async (tx) => {
    const messages = createMessagesRepository(tx)
    const idempotency = createIdempotencyRepository(tx)
    if (key !== undefined) {
      await idempotency.lock(key)
      const earlier = await idempotency.find(key)
      if (earlier !== undefined) {
        if (!sameRequest(earlier, request)) throw new IdempotencyMismatch(key.idempotencyKey)
        const row = await messages.find(input.id)
        if (row === undefined) throw new NotFound('message', input.id)
        return { message: await messages.view(row, input.editor), replayed: true }
      }
    }
    const { role } = await readableMessage(messages, input.id, input.editor)
    if (role !== 'sender') throw new Forbidden(`only the sender of message ${input.id} may edit it`)
    if (await messages.lock(input.id, 'update') === undefined) throw new NotFound('message', input.id)
    const edited = await messages.edit(input.id, input.body, input.windowSeconds)
    if (edited === undefined) {
      throw new Forbidden(`message ${input.id} can no longer be edited: edits are allowed for ${input.windowSeconds} s after sending`)
    }
    const message = await messages.view(edited, input.editor)
    if (message.body === '' && message.attachments.length === 0) throw new ValidationFailed('body: must not be empty unless the message has an attachment')
    // Each recipient's copy says which reactions are its own.
    const seen = await messages.viewFor(edited, await messages.readers(input.id))
    await createEventsRepository(tx).append([...seen].map(([address, copy]) => ({
      address, type: 'message.edited', data: { message: copy }, messageId: input.id
    })))
    if (key !== undefined) await idempotency.record(key, requestTag(request), input.id)
    return { message, replayed: false }
  })
}
