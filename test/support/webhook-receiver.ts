import { createHmac, timingSafeEqual } from 'node:crypto'
import { once } from 'node:events'
import { createServer, type IncomingHttpHeaders } from 'node:http'
import type { AddressInfo } from 'node:net'
import type { TestContext } from '../helper.js'

export interface Received {
  headers: IncomingHttpHeaders
  body: string
  event: { id: string, type: string, createdAt: string, data: unknown }
  /** The answer's status the receiver gave. */
  status: number
  /** When the request arrived (performance.now(), this process's clock). */
  at: number
}

export interface ReceiverOptions {
  /** Answer the status and the first bytes of a body, and never end it (nor close the connection). */
  neverEndBody?: boolean
}

/**
 * A webhook receiver on loopback: records every POST and answers with `answer(n)`'s status
 * (n counts requests from 0; 200 by default), `delayMs` after the request arrived. Closed at teardown.
 */
export async function startReceiver (t: TestContext, answer: (n: number, received: Received) => number = () => 200, delayMs = 0, options: ReceiverOptions = {}) {
  const received: Received[] = []
  let arrived = 0
  const waiters: (() => void)[] = []
  const server = createServer((req, res) => {
    let body = ''
    req.setEncoding('utf8').on('data', (chunk: string) => { body += chunk }).on('end', () => {
      const entry: Received = { headers: req.headers, body, event: JSON.parse(body) as Received['event'], status: 0, at: performance.now() }
      entry.status = answer(arrived++, entry)
      setTimeout(() => {
        received.push(entry)
        res.writeHead(entry.status, { 'content-type': 'text/plain' })
        if (options.neverEndBody === true) res.write('ok, and more to come')
        else res.end('ok')
        for (const wake of waiters.splice(0)) wake()
      }, delayMs)
    })
  })
  let connections = 0
  server.on('connection', (socket) => {
    connections++
    socket.once('close', () => { connections-- })
  })
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  t.teardown(() => new Promise<void>((resolve) => {
    server.closeAllConnections()
    server.close(() => resolve())
  }))
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/hook`
  return {
    url,
    received,
    /** The deliveries answered 2xx, in arrival order. */
    delivered: () => received.filter((r) => r.status >= 200 && r.status < 300),
    /** Connections open to the receiver now (the sender keeps them alive between deliveries). */
    connections: () => connections,
    /** Resolves once `done()` holds, or rejects after `ms`. */
    async until (done: () => boolean, ms = 20_000): Promise<void> {
      const deadline = Date.now() + ms
      while (!done()) {
        if (Date.now() > deadline) throw new Error(`the receiver waited ${ms} ms; it has ${received.length} requests`)
        await new Promise<void>((resolve) => {
          waiters.push(resolve)
          setTimeout(resolve, 200)
        })
      }
    }
  }
}

/** Checks X-Parley-Signature the way docs/webhooks.md tells receivers to: true when it is valid and fresh. */
export function validSignature (secret: string, header: string | string[] | undefined, body: string, toleranceSeconds = 300): boolean {
  if (typeof header !== 'string') return false
  const parts = Object.fromEntries(header.split(',').map((p) => p.split('=', 2) as [string, string]))
  const t = Number(parts.t)
  if (!Number.isInteger(t) || Math.abs(Date.now() / 1000 - t) > toleranceSeconds || parts.v1 === undefined) return false
  const expected = createHmac('sha256', secret).update(`${t}.${body}`).digest()
  const given = Buffer.from(parts.v1, 'hex')
  return given.length === expected.length && timingSafeEqual(given, expected)
}
