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
import { createHmac, timingSafeEqual } from 'node:crypto'
import { createServer } from 'node:http'

const api = process.env.PARLEY_URL ?? 'http://127.0.0.1:3000'
const authorization = `Basic ${Buffer.from(`${process.env.PARLEY_KEY_ID}:${process.env.PARLEY_SECRET}`).toString('base64')}`
const port = Number(process.env.BOT_PORT ?? 4000)

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

/** True when `header` (X-Parley-Signature) signs `rawBody` with `secret` and is fresh (docs/webhooks.md). */
function verifyParleySignature (secret, header, rawBody, toleranceSeconds = 300) {
  const parts = Object.fromEntries(String(header).split(',').map((p) => p.split('=', 2)))
  const t = Number(parts.t)
  if (!Number.isInteger(t) || Math.abs(Date.now() / 1000 - t) > toleranceSeconds || !parts.v1) return false
  const expected = createHmac('sha256', secret).update(`${t}.${rawBody}`).digest()
  const given = Buffer.from(parts.v1, 'hex')
  return given.length === expected.length && timingSafeEqual(given, expected)
}

const me = (await call('GET', '/v2/whoami')).user.address
let webhook
// Delivery is at least once: remember recent event ids and answer each once.
const seen = new Set()

const server = createServer((req, res) => {
  const chunks = []
  req.on('data', (chunk) => chunks.push(chunk))
  req.on('end', async () => {
    const raw = Buffer.concat(chunks).toString('utf8')
    if (webhook === undefined || !verifyParleySignature(webhook.secret, req.headers['x-parley-signature'], raw)) {
      res.writeHead(401).end()
      return
    }
    const event = JSON.parse(raw)
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
