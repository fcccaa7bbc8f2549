import { sql } from 'drizzle-orm'
import type { Db } from '../../db/client.js'
import { queryRows } from '../../db/rows.js'
import { transaction } from '../../db/transaction.js'
import { createEventsRepository } from '../events/events.repository.js'
import type { EventData } from '../events/events.schemas.js'
import { reactionFanouts } from './messages.table.js'

/**
 * The most feeds one transaction of a reaction's fan-out writes to. A reaction in a 1,000-member
 * group is 999 events: as one transaction, about 600 kB of WAL that every other key's commit
 * behind it waited to flush (on a disk flushing 2 MB/s, a bystander's send took 340 ms against
 * 30 alone). In transactions of 100, at most about 60 kB stands ahead of anyone's commit.
 */
export const FANOUT_CHUNK = 100

type ReactionData = EventData<'message.reaction'>

/** The advisory lock class of a message's tellers ("fanr"), keyed by the message id's hash. */
const FANOUT_LOCK_CLASS = 0x66616e72

export function createReactionFanoutsRepository (db: Db) {
  return {
    /** In the reaction's transaction: its event, to be told to the message's readers but `reactor` (tellNext). Answers its id. */
    async enqueue (messageId: string, data: ReactionData, reactor: string): Promise<number> {
      const [row] = await db.insert(reactionFanouts).values({ messageId, data, reactor }).returning({ id: reactionFanouts.id })
      return row!.id
    },

    /** Whether `messageId` has a fan-out not yet told whole (under its lock: a later reaction must queue behind it). */
    async pending (messageId: string): Promise<boolean> {
      const rows = await queryRows<{ one: number }>(db, sql`SELECT 1 AS one FROM ${reactionFanouts} WHERE message_id = ${messageId} LIMIT 1`)
      return rows.length > 0
    },

    /**
     * One transaction of `messageId`'s oldest fan-out: its next FANOUT_CHUNK readers (the
     * sender, then the recipients that have not hidden it, in address order after the last told,
     * the reactor aside) each get the event; the fan-out is deleted once none is left. Tellers
     * of one message (its reacting requests, a sweep, on any instance) take turns on a lock of
     * their own first, so only the one telling holds anything of the message. Then the message
     * itself (key share: beside a reaction's or a hide's lock, but a delete, an edit or a
     * retention purge waits for the chunk, or skips the message, and so erases the copies a
     * purge erases), then the fan-out's row, so each reader is told once. Answers which fan-out
     * it told and whether that one is done, or undefined when the message had none left (or is
     * gone, with them).
     */
    async tellNext (messageId: string): Promise<{ id: number, done: boolean } | undefined> {
      return transaction(db, async (tx) => {
        await tx.execute(sql`SELECT pg_advisory_xact_lock(${FANOUT_LOCK_CLASS}, hashtext(${messageId}))`)
        const [message] = await queryRows<{ one: number }>(tx, sql`SELECT 1 AS one FROM messages WHERE id = ${messageId} FOR KEY SHARE`)
        if (message === undefined) return undefined
        const [fanout] = await queryRows<{ id: string | number, data: ReactionData, reactor: string, told_through: string | null }>(tx, sql`
          SELECT id, data, reactor, told_through FROM ${reactionFanouts} WHERE message_id = ${messageId} ORDER BY id LIMIT 1 FOR UPDATE`)
        if (fanout === undefined) return undefined
        const readers = await queryRows<{ address: string }>(tx, sql`
          SELECT address FROM (
            SELECT sender AS address FROM messages WHERE id = ${messageId}
            UNION SELECT recipient FROM deliveries WHERE message_id = ${messageId} AND hidden_at IS NULL
          ) r
          WHERE address <> ${fanout.reactor} AND address > ${fanout.told_through ?? ''}
          ORDER BY address LIMIT ${FANOUT_CHUNK}`)
        await createEventsRepository(tx).append(readers.map(({ address }) => ({ address, type: 'message.reaction', data: fanout.data, messageId })))
        const done = readers.length < FANOUT_CHUNK
        if (done) {
          await tx.execute(sql`DELETE FROM ${reactionFanouts} WHERE id = ${fanout.id}`)
        } else {
          await tx.execute(sql`UPDATE ${reactionFanouts} SET told_through = ${readers.at(-1)!.address} WHERE id = ${fanout.id}`)
        }
        return { id: Number(fanout.id), done }
      })
    },

    /**
     * Drops `reactor`'s fan-outs still queued (its erasure) and answers their messages: a teller's
     * transaction under way finishes first (the row lock), so the erasure that follows sees every
     * copy it wrote. One that a teller finished meanwhile is not among them.
     */
    async forgetBy (reactor: string): Promise<string[]> {
      const rows = await queryRows<{ message_id: string }>(db, sql`DELETE FROM ${reactionFanouts} WHERE reactor = ${reactor} RETURNING message_id`)
      return [...new Set(rows.map((r) => r.message_id))]
    },

    /**
     * Messages with a fan-out begun more than `olderThanMs` ago, which its request left (its
     * process stopped, or telling failed), oldest first; with each, its newest fan-out now, which a sweep tells up to and no further.
     */
    async stale (olderThanMs: number, limit: number): Promise<{ messageId: string, newest: number }[]> {
      const rows = await queryRows<{ message_id: string, newest: string | number }>(db, sql`
        SELECT message_id, max(id) AS newest FROM ${reactionFanouts}
        WHERE message_id IN (SELECT message_id FROM ${reactionFanouts} WHERE created_at < now() - make_interval(secs => ${olderThanMs / 1000}))
        GROUP BY message_id ORDER BY min(id) LIMIT ${limit}`)
      return rows.map((r) => ({ messageId: r.message_id, newest: Number(r.newest) }))
    }
  }
}
