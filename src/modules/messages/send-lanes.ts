import type { Db } from '../../db/client.js'
import { createGroupsRepository } from '../groups/groups.repository.js'
import { createBatchLane, type LaneStage } from './batch-lane.js'
import type { BatchSend } from './send-batch.repository.js'

/** Sends to users written by one statement at most. */
const MAX_BATCH = 64
/**
 * Sends to groups written by one statement at most: each fans out to up to MAX_GROUP_MEMBERS
 * rows, so their batches are smaller, and they have lanes of their own, so a send to one user
 * never waits behind a large group's fan-out.
 */
const MAX_GROUP_BATCH = 16

/**
 * A group send reaching this many members or more goes to the large groups' lane, with batches
 * of their own (and a second beside a stuck one, as in every lane). Without it one key sending
 * to a 1,000-member group, four at a time as admission lets it, filled both batches of the
 * group lane with 1,000-row fan-outs, and another key's send to a group of three waited behind
 * them (p99 428 ms; see test/whole-machine/noisy-neighbour.test.ts). A group's size is counted
 * on its first send in this process and then taken from each write; a batch of either group
 * lane takes at most LARGE_BATCH_ROWS recipients (one send always goes, however large), so a
 * group that grew since it was counted still fans out a bounded batch.
 */
const LARGE_FAN_OUT = 100
const LARGE_BATCH_ROWS = 2_000
/** Group sizes remembered, the most recently sent to kept. */
const GROUP_SIZES_KEPT = 10_000

/**
 * Send batches in flight at once for a pool of `poolSize` connections, per kind (users, groups):
 * two at most, the second only while it pays (see SECOND_BATCH_QUEUE in batch-lane.ts). More
 * only made batches smaller on two cores.
 */
export function sendBatches (poolSize: number): number {
  return Math.max(1, Math.min(2, poolSize))
}

interface SendLanesOptions<P> {
  /** Batches in flight at once per lane, each on its own connection (PGlite has one: 1). */
  concurrency: number
  /** Writes a batch of sends taken from a lane (see BatchLaneOptions.write). */
  write: (batch: P[], written: () => void) => Promise<void>
  /** Told each send's wait in its lane and each batch's statement time (BatchLaneOptions.observe). */
  observe?: (stage: LaneStage, seconds: number) => void
}

/**
 * The lanes sends queue in before they are written together: to users, to small groups, to
 * large groups (by the size of each group's last fan-out), each batching by the send's rules.
 */
export function createSendLanes<P extends { send: BatchSend }> (db: Db, options: SendLanesOptions<P>) {
  // Recipients each group's last send reached: which lane its next send takes.
  const groupSizes = new Map<string, number>()
  const toUsers = lane(MAX_BATCH)
  const toGroups = lane(MAX_GROUP_BATCH, LARGE_BATCH_ROWS)
  const toLargeGroups = lane(MAX_GROUP_BATCH, LARGE_BATCH_ROWS)

  /**
   * With a row budget, a batch takes sends while their groups' fan-outs fit (a size unknown
   * counts as the whole budget), the first one always.
   */
  function lane (maxBatch: number, rowBudget = Infinity) {
    const cost = (s: BatchSend): number => rowBudget === Infinity ? 0 : groupSizes.get(s.recipient) ?? rowBudget
    return createBatchLane<P>({
      maxBatch,
      concurrency: options.concurrency,
      write: options.write,
      observe: options.observe,
      /**
       * A send with an Idempotency-Key goes only in a batch with no other send of its API key:
       * its quota is then asked alone and never retried in a later transaction, after its lock
       * was let go (a retry with other fields could take the key meanwhile). The others wait for
       * the next batch.
       */
      canJoin ({ send }, batch) {
        const hasKey = send.idempotencyKey !== undefined
        let rows = cost(send)
        for (const { send: s } of batch) {
          if (s.keyId === send.keyId && (hasKey || s.idempotencyKey !== undefined)) return false
          rows += cost(s)
        }
        return rows <= rowBudget
      }
    })
  }

  function remember (group: string, size: number): void {
    groupSizes.delete(group)
    groupSizes.set(group, size)
    if (groupSizes.size > GROUP_SIZES_KEPT) groupSizes.delete(groupSizes.keys().next().value!)
  }

  // Counts in flight: sends to a group not yet counted all wait on the one count, and so join
  // their lane in the order they were made.
  const counting = new Map<string, Promise<number>>()
  function countOnce (group: string): Promise<number> {
    let count = counting.get(group)
    if (count === undefined) {
      count = createGroupsRepository(db).activeMemberCount(group)
        .then((size) => { remember(group, size); return size })
        .finally(() => counting.delete(group))
      counting.set(group, count)
    }
    return count
  }

  return {
    /** A send's lane: to a user, to a small group, or to a large one (counted on first sight). */
    async of (send: BatchSend) {
      if (!send.toGroup) return toUsers
      const size = groupSizes.get(send.recipient) ?? await countOnce(send.recipient)
      return size < LARGE_FAN_OUT ? toGroups : toLargeGroups
    },
    /** A group's size, as a write to it just fanned out. */
    remember
  }
}
