import type { Conversation } from './conversations.js'
import { currentSession, type Session } from './session.js'
import type { Message } from './types.js'

// Status reports go out one at a time, so catching up on many messages stays well inside the
// key's rate limit.
let reports: Promise<void> = Promise.resolve()

/** Tells the sender an incoming message was delivered or read; read only once per message. */
export function report (s: Session, message: Message, status: 'delivered' | 'read'): void {
  if (message.sender === s.me) return
  if (status === 'read') {
    if (s.reportedRead.has(message.id)) return
    s.reportedRead.add(message.id)
  }
  reports = reports.then(async () => {
    if (currentSession() !== s) return
    await s.api.report(message.id, status).catch(() => {})
    await new Promise((resolve) => setTimeout(resolve, 100))
  })
}

/**
 * Marks the open conversation read up to the newest message from others it shows: one call
 * (POST /conversations/{peer}/read) however many messages that covers, and none when nothing
 * new from others is shown.
 */
export function markShown (s: Session, conversation: Conversation): void {
  let newest = ''
  for (const m of conversation.messages.values()) if (m.sender !== s.me && m.id > newest) newest = m.id
  if (newest === '' || newest <= conversation.readUpTo) return
  conversation.readUpTo = newest
  reports = reports.then(async () => {
    if (currentSession() !== s) return
    await s.api.markRead(conversation.id, newest).catch(() => {})
  })
}
