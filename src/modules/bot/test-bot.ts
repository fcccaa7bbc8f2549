import type { FastifyBaseLogger } from 'fastify'
import type { Db } from '../../db/client.js'
import { loggableError } from '../../db/errors.js'
import { transaction } from '../../db/transaction.js'
import { createEventsRepository, toEvent } from '../events/events.repository.js'
import type { FeedWaiting } from '../events/feed-waiting.js'
import { createMessagesRepository } from '../messages/messages.repository.js'
import { advanceStatus } from '../messages/receipts.service.js'
import { writeBatch } from '../messages/send-batch.repository.js'
import { batchSendOf, newMessage } from '../messages/send.service.js'

const BATCH = 20
// A missed notification (a connection blip) delays a reply by at most this much.
const SAFETY_POLL_MS = 1_000

/**
 * Answers every message sent to the test bot exactly once, with `echo: <body>`, and marks the
 * original read. The bot's feed is its queue: each instance claims events with
 * FOR UPDATE SKIP LOCKED and acknowledges them in the transaction that writes the reply, so
 * with any number of instances each message is answered once, and a crash answers it later.
 */
export function createTestBot (db: Db, feed: FeedWaiting, address: string, log: FastifyBaseLogger) {
  let stopping: AbortController | undefined
  let loop: Promise<void> | undefined

  /**
   * Claims and answers one message in its own short transaction. A batch in one transaction
   * locked its senders' user rows in batch order while group fan-out locks them in address
   * order: the two deadlocked (#12), and bot instances deadlocked each other. One message per
   * transaction locks one sender's row (its reply and its read receipt both go to that feed),
   * so there is no second lock to take out of order; SKIP LOCKED lets instances share the
   * queue. Returns whether there was a message.
   */
  async function answerOne (): Promise<boolean> {
    return transaction(db, async (tx) => {
      const claimed = await createEventsRepository(tx).takeOldest(address, 'message.received')
      if (claimed === undefined) return false
      const received = toEvent(claimed)
      if (received.type !== 'message.received') return true
      const original = received.data.message
      if (original.sender === address) return true
      // Still there? A message deleted before the bot got to it gets no answer; one edited since
      // is answered as it now reads.
      const current = await createMessagesRepository(tx).find(original.id)
      if (current === undefined) return true
      // The reply is written as a send is, counted for no one, as a reply to the original; a
      // sender deactivated since (or gone) gets none, and the statement writes nothing for it.
      const message = newMessage({ sender: address, recipient: original.sender, body: `echo: ${current.body}`, files: [], replyTo: original.id })
      await writeBatch(tx, [batchSendOf(message, { files: [], toGroup: false, countsAgainst: null })])
      await advanceStatus(tx, original, address, 'read')
      return true
    })
  }

  async function answerBatch (): Promise<number> {
    let answered = 0
    while (answered < BATCH && await answerOne()) answered++
    return answered
  }

  /**
   * A full batch may have left more to answer: the feed is read again at once. Fewer (or a
   * failure, retried after the wait) and the bot waits for the bus to say its feed grew.
   */
  async function moreLeft (): Promise<true | undefined> {
    try {
      return await answerBatch() === BATCH ? true : undefined
    } catch (err) {
      log.warn({ err: loggableError(err) }, 'test bot could not answer; retrying')
      return undefined
    }
  }

  async function run (signal: AbortSignal): Promise<void> {
    // Stops with the bus too (follow ends once it is closing): a wait would return at once and only spin.
    const batches = feed.follow(address, { read: moreLeft, safetyMs: SAFETY_POLL_MS, signal })
    for await (const more of batches) void more
  }

  return {
    start (): void {
      if (stopping !== undefined) return
      stopping = new AbortController()
      loop = run(stopping.signal)
    },
    async stop (): Promise<void> {
      stopping?.abort()
      await loop
      stopping = undefined
    }
  }
}
