/**
 * Waits `ms`, or less if `signal` aborts first (never rejects): the pause a background job
 * (retention, erasure) takes between two batches, cut short at shutdown.
 */
export function rest (ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(timer)
      signal?.removeEventListener('abort', done)
      resolve()
    }
    const timer = setTimeout(done, ms)
    signal?.addEventListener('abort', done, { once: true })
  })
}
