import { createHmac } from 'node:crypto'
import { Agent as HttpAgent, request as httpRequest, type IncomingMessage } from 'node:http'
import { Agent as HttpsAgent, request as httpsRequest } from 'node:https'
import { isIP } from 'node:net'
import { guardedLookup, isPrivateAddress } from './webhook-target.js'

/** A delivery must be answered 2xx within this long (API.md §9). */
const DELIVERY_TIMEOUT_MS = 10_000
/**
 * What is read of an answer's body, after its status has decided the delivery, before the
 * connection is cut: receivers have nothing to tell us, and reading a short body to its end
 * only lets the kept-alive connection serve the next delivery.
 */
const MAX_RESPONSE_BYTES = 4 * 1024
/** How long that short body may take to end before the connection is cut. */
const DRAIN_MS = 1_000

/** `t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">`, Stripe's scheme (docs/webhooks.md). */
export function signature (secret: string, body: string, at: Date): string {
  const t = Math.floor(at.getTime() / 1000)
  return `t=${t},v1=${createHmac('sha256', secret).update(`${t}.${body}`).digest('hex')}`
}

export interface Outcome { delivered: boolean, error: string | null }

/**
 * POSTs webhook bodies: kept-alive connections, no redirects followed (a 3xx is a failure),
 * DELIVERY_TIMEOUT_MS for the answer's status, at most MAX_RESPONSE_BYTES of its body read (and
 * for DRAIN_MS at most, after the outcome is settled),
 * and no private target unless allowed, checked as each connection is made.
 */
export function createWebhookSender (allowPrivate: boolean) {
  const lookup = guardedLookup(allowPrivate)
  const agents = {
    'http:': new HttpAgent({ keepAlive: true, maxSockets: 16, lookup } as ConstructorParameters<typeof HttpAgent>[0]),
    'https:': new HttpsAgent({ keepAlive: true, maxSockets: 16, lookup } as ConstructorParameters<typeof HttpsAgent>[0])
  }
  /** One POST; `staleSocket` when it failed on a reused connection before any answer came. */
  function attempt (url: URL, body: string, headers: Record<string, string>, deadline: number): Promise<Outcome & { staleSocket?: boolean }> {
    const request = url.protocol === 'https:' ? httpsRequest : httpRequest
    return new Promise((resolve) => {
      let settled = false
      const settle = (outcome: Outcome & { staleSocket?: boolean }) => {
        if (settled) return
        settled = true
        clearTimeout(timer)
        resolve(outcome)
      }
      const req = request(url, {
        method: 'POST',
        agent: agents[url.protocol as 'http:' | 'https:'],
        lookup,
        headers: { ...headers, 'content-length': String(Buffer.byteLength(body)), 'user-agent': 'Parley-Webhooks/2' }
      }, (res: IncomingMessage) => {
        // The status is the answer (a 2xx within the deadline delivers): it settles now, not
        // when the body ends. A receiver that answered 200 and never ended its body had the
        // event counted failed at the deadline and sent again, for ever.
        const status = res.statusCode ?? 0
        settle(status >= 200 && status < 300
          ? { delivered: true, error: null }
          : { delivered: false, error: `answered ${status}${status >= 300 && status < 400 ? ' (redirects are not followed)' : ''}` })
        // The body is discarded: a short one drained so the connection is kept; past
        // MAX_RESPONSE_BYTES or DRAIN_MS the connection is cut instead.
        let read = 0
        const cut = setTimeout(() => res.destroy(), DRAIN_MS)
        res.on('data', (chunk: Buffer) => {
          read += chunk.length
          if (read > MAX_RESPONSE_BYTES) res.destroy()
        })
        res.on('close', () => clearTimeout(cut))
        res.on('error', () => { /* the outcome is settled; a cut body is no one's failure */ })
      })
      const timer = setTimeout(() => {
        req.destroy()
        settle({ delivered: false, error: `no answer within ${DELIVERY_TIMEOUT_MS / 1000} s` })
      }, Math.max(0, deadline - Date.now()))
      req.on('error', (err: NodeJS.ErrnoException) => settle({
        delivered: false,
        error: err.message.slice(0, 200),
        staleSocket: req.reusedSocket && (err.code === 'ECONNRESET' || err.code === 'EPIPE')
      }))
      req.end(body)
    })
  }

  return {
    async post (target: string, body: string, headers: Record<string, string>): Promise<Outcome> {
      const url = new URL(target)
      const host = url.hostname.replace(/^\[|\]$/g, '')
      if (!allowPrivate && isIP(host) !== 0 && isPrivateAddress(host)) return { delivered: false, error: `${host} is a private address` }
      // A kept-alive connection the receiver closed just as we reused it (its idle timeout) is
      // not the receiver failing: try once more on a new connection, as Node's docs advise.
      // Both tries share the one deadline.
      const deadline = Date.now() + DELIVERY_TIMEOUT_MS
      let { staleSocket, ...outcome } = await attempt(url, body, headers, deadline)
      if (staleSocket === true && Date.now() < deadline) ({ staleSocket, ...outcome } = await attempt(url, body, headers, deadline))
      return outcome
    },
    close (): void {
      agents['http:'].destroy()
      agents['https:'].destroy()
    }
  }
}

export type WebhookSender = ReturnType<typeof createWebhookSender>
