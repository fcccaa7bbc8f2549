import { setTimeout as sleep } from 'node:timers/promises'

/**
 * Waits until `check` holds, asking every `intervalMs` (default 25), for at most `timeoutMs`
 * (default 10 s); then throws with `message`. For a state a test can see (a long-poll waiting,
 * a delivery made, a line logged) in place of a fixed sleep that a busy machine outlasts.
 */
export async function until (check: () => boolean | Promise<boolean>, options: { timeoutMs?: number, intervalMs?: number, message?: string } = {}): Promise<void> {
  const { timeoutMs = 10_000, intervalMs = 25, message = 'the awaited state' } = options
  const deadline = performance.now() + timeoutMs
  while (!await check()) {
    if (performance.now() >= deadline) throw new Error(`${message}: not reached within ${timeoutMs} ms`)
    await sleep(intervalMs)
  }
}
