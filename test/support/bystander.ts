import { setTimeout as sleep } from 'node:timers/promises'

/** The 99th percentile of `values` (0 for none). */
export const p99 = (values: number[]): number => [...values].sort((a, b) => a - b)[Math.ceil(values.length * 0.99) - 1] ?? 0

/**
 * Sends bob (or `recipient`) a message again and again until stop(); each answer's status and latency. With
 * everyMs, one send starts at most that often (to stay inside the default rate limit).
 */
export function bystander (base: string, authorization: string, everyMs = 0, recipient = 'bob') {
  const results: { status: number, ms: number }[] = []
  let running = true
  let lastStart = 0
  const loop = (async () => {
    while (running) {
      const started = performance.now()
      if (everyMs > 0 && results.length > 0) await sleep(everyMs - (started - lastStart))
      lastStart = performance.now()
      const res = await fetch(`${base}/v2/message`, {
        method: 'POST', headers: { authorization, 'content-type': 'application/json' }, body: JSON.stringify({ recipient, body: 'still here' })
      })
      await res.arrayBuffer()
      results.push({ status: res.status, ms: performance.now() - lastStart })
    }
  })()
  return {
    async stop () {
      running = false
      await loop
      return results
    }
  }
}
