import type { FastifyBaseLogger } from 'fastify'
import { and, asc, eq, inArray, isNull, sql } from 'drizzle-orm'
import type { Db } from '../../db/client.js'
import type { EventBus } from '../events/event-bus.js'
import { events } from '../events/events.table.js'
import { createMessagesRepository } from '../messages/messages.repository.js'
import type { Message } from '../messages/messages.schemas.js'
import { advanceStatus } from '../messages/receipts.js'
import { deliverMessage } from '../messages/send-message.js'
import { loggableError } from '../../plugins/errors.js'

const BATCH = 20
// A missed notification (a connection blip) delays a reply by at most this much.
const SAFETY_POLL_MS = 1_000

/**
 * Answers every message sent to the test bot exactly once, with `echo: <body>`, and marks the
 * original read. The bot's feed is its queue: each instance claims events with
 * FOR UPDATE SKIP LOCKED and acknowledges them in the transaction that writes the reply, so
 * with any number of instances each message is answered once, and a crash answers it later.
 */
export function createTestBot (db: Db, bus: EventBus, address: string, log: FastifyBaseLogger) {
  let running = false
  let loop: Promise<void> | undefined
  let current: { cancel(): void } | undefined

  async function answerBatch (): Promise<number> {
    return db.transaction(async (tx) => {
      const claimed = await tx.select({ seq: events.seq, data: events.data }).from(events)
        .where(and(eq(events.address, address), eq(events.type, 'message.received'), isNull(events.ackedAt)))
        .orderBy(asc(events.seq))
        .limit(BATCH)
        .for('update', { skipLocked: true })
      if (claimed.length === 0) return 0
      await tx.update(events).set({ ackedAt: sql`now()` })
        .where(and(eq(events.address, address), inArray(events.seq, claimed.map((c) => c.seq))))
      const messages = createMessagesRepository(tx)
      for (const { data } of claimed) {
        const original = (data as { message: Message }).message
        if (original.sender === address) continue
        // Still there? A message deleted before the bot got to it gets no answer.
        if (await messages.find(original.id) === undefined) continue
        await deliverMessage(tx, { sender: address, recipient: original.sender, body: `echo: ${original.body}`, files: [] })
        await advanceStatus(tx, original, address, 'read')
      }
      return claimed.length
    })
  }

  async function run (): Promise<void> {
    // Stops with the bus too: once it is closing, a wait returns at once and would only spin.
    while (running && !bus.closing) {
      const subscription = bus.subscribe(address)
      current = subscription
      try {
        while (running && await answerBatch() === BATCH) { /* drain */ }
      } catch (err) {
        log.warn({ err: loggableError(err) }, 'test bot could not answer; retrying')
      }
      await subscription.wait(SAFETY_POLL_MS)
      subscription.cancel()
    }
  }

  return {
    start (): void {
      if (running) return
      running = true
      loop = run()
    },
    async stop (): Promise<void> {
      running = false
      current?.cancel()
      await loop
    }
  }
}
