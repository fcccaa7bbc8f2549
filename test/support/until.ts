import { setTimeout as sleep } from 'node:timers/promises'

/**
 * Resolves once `check` holds, asking again every `intervalMs` (25 ms); throws `message` when
 * it still does not hold after `timeoutMs` (10 s). For a test that waits for a state it can
 * see (a poll waiting, a webhook delivered, a log line written) instead of sleeping for a time
 * that is too long on a quiet machine and too short on a busy one.
 */
export async function until (check: () => boolean | Promise<boolean>, options?: { timeoutMs?: number, intervalMs?: number, message?: string }): Promise<void> {
  const timeoutMs = options?.timeoutMs ?? 10_000
  const intervalMs = options?.intervalMs ?? 25
  const deadline = Date.now() + timeoutMs
  for (;;) {
    if (await check()) return
    if (Date.now() >= deadline) throw new Error(options?.message ?? `the awaited state did not come within ${timeoutMs} ms`)
    await sleep(intervalMs)
  }
}
