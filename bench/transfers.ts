/**
 * Scenario 8, attachments: four concurrent sends of 10 x 25 MiB (from four keys, streamed, never
 * held whole), then every file downloaded back, four at a time; MiB/s each way and the service's
 * peak RSS, sampled every 100 ms. See BENCHMARKS.md.
 */
import { randomBytes } from 'node:crypto'
import type { Key } from './fixtures.js'

export interface TransferResult { uploadMiBps: number, downloadMiBps: number, mib: number, peakRss: number, rssBefore: number }

const FILES = 10
const FILE_BYTES = 25 * 1024 * 1024
const SENDERS = 4

export async function transfers (url: string, senders: Key[], recipient: Key, rss: () => number): Promise<TransferResult> {
  const file = new Blob([new Uint8Array(randomBytes(FILE_BYTES))], { type: 'application/octet-stream' })
  const rssBefore = rss()
  let peakRss = rssBefore
  const sampler = setInterval(() => { peakRss = Math.max(peakRss, rss()) }, 100)
  try {
    const mib = SENDERS * FILES * FILE_BYTES / 2 ** 20
    const upStart = performance.now()
    const ids = await Promise.all(senders.slice(0, SENDERS).map(async (sender) => {
      const form = new FormData()
      form.append('recipient', recipient.address)
      for (let i = 0; i < FILES; i++) form.append('attachment', file, `f${i}.bin`)
      const res = await fetch(`${url}/v2/message`, { method: 'POST', headers: { authorization: sender.authorization }, body: form })
      if (res.status !== 200) throw new Error(`upload answered ${res.status}: ${await res.text()}`)
      return (await res.json() as { id: string }).id
    }))
    const uploadSeconds = (performance.now() - upStart) / 1000
    const downStart = performance.now()
    await Promise.all(ids.map(async (id) => {
      for (let i = 1; i <= FILES; i++) {
        const res = await fetch(`${url}/v2/message/${id}/attachment/${i}`, { headers: { authorization: recipient.authorization } })
        let bytes = 0
        for await (const chunk of res.body!) bytes += (chunk as Uint8Array).length
        if (bytes !== FILE_BYTES) throw new Error(`download of ${id}/${i} brought ${bytes} bytes`)
      }
    }))
    const downloadSeconds = (performance.now() - downStart) / 1000
    return { uploadMiBps: mib / uploadSeconds, downloadMiBps: mib / downloadSeconds, mib, peakRss, rssBefore }
  } finally {
    clearInterval(sampler)
  }
}
