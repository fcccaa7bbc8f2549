/**
 * The two sends the benchmarks make: a short JSON message, and the same with a 10 KiB image as
 * multipart/form-data (scenarios 1 and 2 of BENCHMARKS.md).
 */
import { randomBytes } from 'node:crypto'
import type { Key } from './fixtures.js'

export interface Request { path: string, method: 'GET' | 'POST', headers: Record<string, string>, body?: string | Buffer }

export const jsonSend = (from: Key, recipient: string): Request => ({
  path: '/v2/message',
  method: 'POST',
  headers: { authorization: from.authorization, 'content-type': 'application/json' },
  body: JSON.stringify({ recipient, body: 'hello from the benchmark' })
})

/** A PNG signature and random bytes, so nothing on the way can compress it. */
const IMAGE = Buffer.concat([Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]), randomBytes(10 * 1024 - 8)])

export function multipartSend (from: Key, recipient: string): Request {
  const boundary = 'parleyBenchBoundary'
  const field = (name: string, value: string) => `--${boundary}\r\nContent-Disposition: form-data; name="${name}"\r\n\r\n${value}\r\n`
  const body = Buffer.concat([
    Buffer.from(field('recipient', recipient) + field('body', 'a picture') +
      `--${boundary}\r\nContent-Disposition: form-data; name="attachment"; filename="bench.png"\r\nContent-Type: image/png\r\n\r\n`),
    IMAGE,
    Buffer.from(`\r\n--${boundary}--\r\n`)
  ])
  return { path: '/v2/message', method: 'POST', headers: { authorization: from.authorization, 'content-type': `multipart/form-data; boundary=${boundary}` }, body }
}
