import type { FastifyBaseLogger } from 'fastify'
import type { Db } from '../../db/client.js'
import { loggableError } from '../../db/errors.js'
import { createSettingsRepository } from '../../db/settings.repository.js'
import { transaction } from '../../db/transaction.js'
import { rest } from '../../rest.js'
import { createUsersRepository } from '../users/users.repository.js'
import { ERASURE_BATCH, eraseNextBatch, type ErasureBatch } from './erasure.service.js'

const EVERY_MS = 60 * 1000
/** The first look after start: a restarted instance goes on with pending erasures. */
const FIRST_MS = 5_000
// "parley erasure": one batch at a time across instances (retention's lock idea, a lock of its own).
const ERASURE_LOCK_KEY = 0x65726173
/** The longest rest between two batches (the rest is as long as the batch took). */
const MAX_REST_MS = 1_000
/** Besides the key cache and the request timeout: time for a send admitted just before to commit. */
const COMMIT_MARGIN_MS = 10_000

/**
 * How long after its request an erasure stays pending at least: a key of the user is refused
 * at once on the instance that took the request but on the others only once their key cache
 * forgets it (`keyCacheMs`), and a request admitted before that may still be receiving its body
 * (REQUEST_TIMEOUT_SECONDS) and then commit a message. Until this has passed the job keeps
 * looking, so what such a request leaves is erased too; only then is the erasure done.
 */
export function erasureGraceMs (keyCacheMs: number, requestTimeoutSeconds: number): number {
  return keyCacheMs + requestTimeoutSeconds * 1000 + COMMIT_MARGIN_MS
}

export interface ErasureOptions {
  /** erasureGraceMs(): an erasure is marked done only this long after it was asked for. */
  graceMs: number
  /** How much one transaction does (ERASURE_BATCH unless a test makes it small). */
  batch?: ErasureBatch | undefined
  /** Do at most this many batches in this run; the next run goes on from there. */
  maxBatches?: number
  /** Rest between batches as long as each took (at most a second), leaving the database to other work half the time. */
  rest?: boolean
  /** Stops the run between two batches (shutdown). */
  signal?: AbortSignal
}

export interface ErasureResult {
  /** False when another instance's run held the lock: that one goes on with the work. */
  ran: boolean
  /** Batches that removed something. */
  batches: number
  /** Users whose erasure this run found complete and marked done. */
  erased: string[]
  /** Milliseconds until the soonest erasure with nothing left but its grace may be marked done; undefined when none waits. */
  dueInMs: number | undefined
  /** Users whose erasure failed this run (the next run tries again): one user's failure holds up no other's. */
  failed: { address: string, err: unknown }[]
}

type Outcome = 'batch' | 'erased' | 'waiting'

/**
 * Works through every pending erasure (API.md §14), oldest request first: batch after batch,
 * each its own short transaction under an advisory lock (so instances never erase at once, and
 * never the same rows), each doing the next bounded piece (eraseNextBatch). When nothing is left
 * of a user and its grace has passed, the same transaction marks it erased. A kill between
 * batches, the batch limit or shutdown leaves the rest in the database for the next run, on
 * any instance: a restart goes on where the last batch committed.
 */
export async function eraseRequested (db: Db, options: ErasureOptions): Promise<ErasureResult> {
  const batch = options.batch ?? ERASURE_BATCH
  const result: ErasureResult = { ran: true, batches: 0, erased: [], dueInMs: undefined, failed: [] }
  const pending = await createUsersRepository(db).pendingErasures(options.graceMs)
  for (const { address, dueInMs } of pending) {
    for (;;) {
      if (options.signal?.aborted === true || result.batches >= (options.maxBatches ?? Infinity)) return result
      const started = performance.now()
      let outcome: Outcome | undefined
      try {
        outcome = await transaction(db, async (tx): Promise<Outcome | undefined> => {
          if (!await createSettingsRepository(tx).tryLock(ERASURE_LOCK_KEY)) return undefined
          if (await eraseNextBatch(tx, address, batch) !== undefined) return 'batch'
          return await createUsersRepository(tx).markErased(address, options.graceMs) ? 'erased' : 'waiting'
        })
      } catch (err) {
        // The next user's erasure is not held up by this one's: it is tried again next run.
        result.failed.push({ address, err })
        break
      }
      if (outcome === undefined) return { ...result, ran: false }
      if (outcome === 'erased') {
        result.erased.push(address)
        break
      }
      if (outcome === 'waiting') {
        // At least a moment: the grace ends by the database's clock, which the look above rounded.
        result.dueInMs = Math.min(result.dueInMs ?? Infinity, Math.max(dueInMs, 100))
        break
      }
      result.batches++
      if (options.rest === true) await rest(Math.min(MAX_REST_MS, performance.now() - started), options.signal)
    }
  }
  return result
}

export interface ErasureJob {
  /** Runs now (a request was just recorded), or once more after the run under way. */
  wake(): void
  /** Stops the timers and the run under way after its current batch; resolves once it has ended. */
  stop(): Promise<void>
}

interface ErasureSettings {
  graceMs: number
  batch?: ErasureBatch | undefined
  everyMs?: number
}

/**
 * The erasure job on a timer: every instance looks every minute (first 5 s after start), and the
 * instance that records a request starts at once (wake). An erasure waiting only for its grace
 * gets a run when the grace ends.
 */
export function startErasure (db: Db, log: FastifyBaseLogger, settings: ErasureSettings): ErasureJob {
  const stopping = new AbortController()
  let running: Promise<void> | undefined
  let again = false
  let due: NodeJS.Timeout | undefined
  const run = (): void => {
    if (stopping.signal.aborted) return
    if (running !== undefined) {
      again = true
      return
    }
    running = eraseRequested(db, { graceMs: settings.graceMs, batch: settings.batch, rest: true, signal: stopping.signal }).then(
      (result) => {
        if (result.batches > 0 || result.erased.length > 0) log.info({ erasureBatches: result.batches, erased: result.erased }, 'erasure')
        for (const { address, err } of result.failed) log.warn({ err: loggableError(err), user: address }, 'erasure of a user failed; will retry')
        if (result.dueInMs !== undefined) {
          clearTimeout(due)
          due = setTimeout(run, result.dueInMs)
          due.unref()
        }
      },
      (err: unknown) => log.warn({ err: loggableError(err) }, 'erasure failed; will retry')
    ).finally(() => {
      running = undefined
      if (again) {
        again = false
        run()
      }
    })
  }
  const first = setTimeout(run, FIRST_MS)
  const timer = setInterval(run, settings.everyMs ?? EVERY_MS)
  first.unref()
  timer.unref()
  return {
    wake: run,
    async stop () {
      clearTimeout(first)
      clearInterval(timer)
      clearTimeout(due)
      stopping.abort()
      await running
    }
  }
}
