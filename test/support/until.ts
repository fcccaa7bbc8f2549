import { setTimeout as sleep } from 'node:timers/promises'

/**
 * Waits until `check` holds, looking again every `intervalMs` (default 25), for at most
 * `timeoutMs` (default 10 s); past that, throws with `message`. For a test that waits for a
 * state it can observe (a long-poll waiting, a log line, a row lock taken) instead of sleeping
 * for a guess at how long that takes. Deadlines are generous: the machine may be busy.
 */
export async function until (check: () => boolean | Promise<boolean>, options: { timeoutMs?: number, intervalMs?: number, message?: string } = {}): Promise<void> {
  const { timeoutMs = 10_000, intervalMs = 25, message = 'the condition' } = options
  const deadline = Date.now() + timeoutMs
  for (;;) {
    if (await check()) return
    if (Date.now() >= deadline) throw new Error(`${message}: not within ${timeoutMs} ms`)
    await sleep(intervalMs)
  }
}
