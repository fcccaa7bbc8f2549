import type { Conversation } from './conversations.js'
import { messageList } from './page.js'
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

/** The newest message from others the thread shows inside its visible area, or '' (none, or the thread hidden). */
function newestVisible (): string {
  const box = messageList.getBoundingClientRect()
  if (box.height === 0) return ''
  const items = messageList.querySelectorAll<HTMLElement>('li.theirs')
  for (let i = items.length - 1; i >= 0; i--) {
    const item = items[i]!
    const at = item.getBoundingClientRect()
    if (at.top < box.bottom && at.bottom > box.top) return item.dataset.id ?? ''
    if (at.bottom <= box.top) break
  }
  return ''
}

/**
 * Marks the open conversation read up to the newest message from others the person can see:
 * one call (POST /conversations/{peer}/read) however many messages that covers, and none when
 * nothing new from others came into view (scrolled above it, or the thread hidden behind the
 * list on a narrow screen).
 */
export function markShown (s: Session, conversation: Conversation): void {
  const newest = newestVisible()
  if (newest === '' || newest <= conversation.readUpTo) return
  conversation.readUpTo = newest
  reports = reports.then(async () => {
    if (currentSession() !== s) return
    await s.api.markRead(conversation.id, newest).catch(() => {})
  })
}
