#!/usr/bin/env node
// A Parley bot that runs on webhooks: it registers a webhook for its user's messages, verifies
// each delivery's signature, skips repeats, and answers every message with "echo: <body>".
// Plain Node.js (20 or later), no dependencies:
//
//   PARLEY_URL=http://127.0.0.1:3000 PARLEY_KEY_ID=key_… PARLEY_SECRET=sk_… \
//   BOT_PORT=4000 BOT_URL=http://127.0.0.1:4000/parley node examples/webhook-bot.mjs
//
// BOT_HOST (default 127.0.0.1) and BOT_PORT (0 picks a free one) are where it listens; BOT_URL
// is where Parley reaches it (default http://127.0.0.1:<port>/parley). For a receiver on the
// same machine as Parley the server needs WEBHOOK_ALLOW_PRIVATE=true (docs/webhooks.md). The bot
// prints "listening" once its webhook is registered, deletes the webhook when it stops
// (SIGINT/SIGTERM), and logs one JSON line per message it answers.
//
// Anyone can POST to a receiver, so it reads nothing it need not: a request without a
// well-formed, fresh X-Parley-Signature header is refused (401) before its body is read, and a
// body over MAX_BODY_BYTES (an Event is a few KiB; a message body at most 10,000 characters) is
// refused (413) as soon as it is announced or has grown past it, the connection closed.
import { createHmac, timingSafeEqual } from 'node:crypto'
import { createServer } from 'node:http'

const api = process.env.PARLEY_URL ?? 'http://127.0.0.1:3000'
const authorization = `Basic ${Buffer.from(`${process.env.PARLEY_KEY_ID}:${process.env.PARLEY_SECRET}`).toString('base64')}`
const port = Number(process.env.BOT_PORT ?? 4000)
/** The largest delivery read: an Event is a few KiB, far below it. */
const MAX_BODY_BYTES = 1024 * 1024
/** How far a signature's time may be from ours (docs/webhooks.md). */
const TOLERANCE_SECONDS = 300
/** X-Parley-Signature as Parley writes it: `t=<unix seconds>,v1=<64 hex digits>`. */
const SIGNATURE = /^t=(\d{1,12}),v1=([0-9a-f]{64})$/

async function call (method, path, body) {
  const res = await fetch(`${api}${path}`, {
    method,
    headers: { authorization, ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
    body: body === undefined ? undefined : JSON.stringify(body)
  })
  const text = await res.text()
  if (!res.ok) throw new Error(`${method} ${path}: ${res.status} ${text}`)
  return text === '' ? undefined : JSON.parse(text)
}

/** The parts of an X-Parley-Signature header that is well-formed and fresh, else undefined: checked before any body is read. */
function parseParleySignature (header) {
  const match = typeof header === 'string' ? SIGNATURE.exec(header) : null
  if (match === null) return undefined
  const t = Number(match[1])
  if (Math.abs(Date.now() / 1000 - t) > TOLERANCE_SECONDS) return undefined
  return { t, v1: Buffer.from(match[2], 'hex') }
}

/** True when the signature's HMAC signs `rawBody` with `secret` (docs/webhooks.md). */
function verifyParleySignature (secret, signature, rawBody) {
  const expected = createHmac('sha256', secret).update(`${signature.t}.${rawBody}`).digest()
  return signature.v1.length === expected.length && timingSafeEqual(signature.v1, expected)
}

/**
 * Answers `status` at once and closes the connection, the rest of the request's body unread
 * (what arrives meanwhile is dropped unbuffered, for a moment, so the answer is read before the close).
 */
function refuse (req, res, status) {
  req.removeAllListeners('data').removeAllListeners('end')
  req.resume()
  res.writeHead(status, { connection: 'close' }).end(() => setTimeout(() => req.socket.destroy(), 500).unref())
}

const me = (await call('GET', '/v2/whoami')).user.address
let webhook
// Delivery is at least once: remember recent event ids and answer each once.
const seen = new Set()

const server = createServer((req, res) => {
  const signature = parseParleySignature(req.headers['x-parley-signature'])
  if (webhook === undefined || signature === undefined) return refuse(req, res, 401)
  if (Number(req.headers['content-length'] ?? 0) > MAX_BODY_BYTES) return refuse(req, res, 413)
  const chunks = []
  let size = 0
  req.on('data', (chunk) => {
    size += chunk.length
    if (size > MAX_BODY_BYTES) {
      // Sent without a length, or more than it said: stop reading at the bound.
      chunks.length = 0
      refuse(req, res, 413)
      return
    }
    chunks.push(chunk)
  })
  req.on('end', async () => {
    const raw = Buffer.concat(chunks).toString('utf8')
    if (!verifyParleySignature(webhook.secret, signature, raw)) {
      res.writeHead(401).end()
      return
    }
    let event
    try {
      event = JSON.parse(raw)
    } catch {
      res.writeHead(400).end()
      return
    }
    try {
      if (!seen.has(event.id) && event.type === 'message.received' && event.data.message.sender !== me) {
        const message = event.data.message
        // A group message is answered to the group; a direct one to its sender.
        const recipient = message.recipient.startsWith('grp_') ? message.recipient : message.sender
        await call('POST', '/v2/message', { recipient, body: `echo: ${message.body ?? ''}`.slice(0, 10_000) })
        console.log(JSON.stringify({ answered: message.id, to: recipient }))
      }
      seen.add(event.id)
      if (seen.size > 10_000) seen.delete(seen.values().next().value)
      res.writeHead(204).end()
    } catch (err) {
      // Not answered: a non-2xx makes Parley try this event again later.
      console.error(JSON.stringify({ failed: event.id, error: err.message }))
      res.writeHead(503).end()
    }
  })
})

server.listen(port, process.env.BOT_HOST ?? '127.0.0.1', async () => {
  const listening = server.address().port
  const url = process.env.BOT_URL ?? `http://127.0.0.1:${listening}/parley`
  webhook = await call('POST', '/v2/webhooks', { url, events: ['message.received'] })
  console.log(JSON.stringify({ listening, as: me, webhook: webhook.id }))
})

for (const signal of ['SIGINT', 'SIGTERM']) {
  process.once(signal, async () => {
    if (webhook !== undefined) await call('DELETE', `/v2/webhooks/${webhook.id}`).catch(() => {})
    server.close(() => process.exit(0))
    server.closeAllConnections()
  })
}
