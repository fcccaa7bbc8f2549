import type { FastifyBaseLogger } from 'fastify'
import type { Db } from '../db/client.js'
import { loggableError } from '../db/errors.js'
import { createSettingsRepository } from '../db/settings.repository.js'
import { runSealingPass } from './reseal.js'

/**
 * Recorded once a start's pass has found nothing plain left: every writer seals, so nothing
 * plain is written after, and later starts skip the pass (its counts read every sealed table,
 * a full scan each on a large database). `parley migrate` always runs it.
 */
export const SEALED_ONCE = 'sealing.plain_sealed'

/**
 * The plain pass at every start (API.md §11: an existing plaintext database is sealed online):
 * in the background, so the service answers meanwhile; one line at the end when it did
 * anything. The function returned stops it after its current page and resolves when it has.
 */
export function startSealingPass (db: Db, log: FastifyBaseLogger): () => Promise<void> {
  const stopping = new AbortController()
  const started = performance.now()
  const settings = createSettingsRepository(db)
  const running = settings.has(SEALED_ONCE).then(async (done) => {
    if (done) return
    const result = await runSealingPass(db, { mode: 'plain', signal: stopping.signal })
    if (!result.stopped && result.skipped === 0) await settings.claimOnce(SEALED_ONCE)
    if (result.broken.length > 0) {
      log.error({ records: result.broken.slice(0, 20), count: result.broken.length }, 'sealing: records that do not open under their own key were left as they are')
    }
    if (result.sealed > 0 || result.stopped) {
      log.info({ sealed: result.tables, ms: Math.round(performance.now() - started), stopped: result.stopped },
        result.stopped ? 'sealing of plaintext records stopped by shutdown; the next start goes on' : 'sealed the records written before sealing')
    }
  }).catch((err: unknown) => {
    log.error({ err: loggableError(err) }, 'sealing of plaintext records failed; the next start tries again (or run `parley migrate`)')
  })
  return async () => {
    stopping.abort()
    await running
  }
}
