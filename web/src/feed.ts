import { ApiError } from './api.js'
import { isGroupId } from './conversations.js'
import { connection, threadTitle } from './page.js'
import { refetchReactions } from './reactions.js'
import { report } from './receipts.js'
import { refresh, renderConversations, renderThread, renderTyping, updateTicks } from './render.js'
import { currentSession, signOut, type Session } from './session.js'
import type { FeedEvent } from './types.js'

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

/** Fetches a group's name for a conversation known only by its id, and shows it. */
export async function nameGroup (s: Session, id: string): Promise<void> {
  const group = await s.api.group(id).catch(() => undefined)
  if (group === undefined || currentSession() !== s) return
  s.conversations.get(id).title = group.name
  renderConversations()
  if (s.active === id) threadTitle.textContent = group.name
}

/**
 * The server's list of conversations (GET /v2/conversations): every one the caller has, with its
 * true unread count, whatever the feed still holds (acknowledged, purged, or from before this
 * key). Read once the feed has caught up, so every message counted there is one the feed's
 * replay did not count.
 */
async function syncConversations (s: Session): Promise<void> {
  const list = await s.api.conversations().catch(() => [])
  if (currentSession() !== s) return
  for (const c of list) {
    const { conversation } = s.conversations.add(c.lastMessage)
    conversation.unread = s.active === c.peer ? 0 : c.unread
    if (c.type === 'group' && conversation.title === conversation.id) void nameGroup(s, c.peer)
  }
}

/**
 * Reads the feed from the start, then follows it live until sign-out: over the event stream
 * (Server-Sent Events), or by long-polling where the server or a proxy offers no stream.
 */
export async function follow (s: Session): Promise<void> {
  let failures = 0
  let caughtUp = false
  let streams = true
  while (!s.stop.signal.aborted) {
    try {
      if (caughtUp && streams) {
        connection.textContent = 'live'
        const opened = Date.now()
        streams = await s.api.stream(s.after, s.stop.signal, (event) => {
          handle(s, event, true)
          s.after = event.id
          failures = 0
        })
        // An open stream that ended (a restart, a proxy's timeout): open it again, at once
        // unless it lasted under a second.
        if (streams && Date.now() - opened < 1_000) await sleep(1_000)
        continue
      }
      if (caughtUp) connection.textContent = 'live (polling)'
      const page = await s.api.events(s.after, caughtUp ? 25 : 0, s.stop.signal)
      for (const event of page.events) handle(s, event, caughtUp)
      s.after = page.last
      if (page.events.length === 0 && !caughtUp) {
        caughtUp = true
        await syncConversations(s)
        renderConversations()
        if (s.active !== undefined) renderThread()
      }
      failures = 0
      if (!caughtUp) connection.textContent = 'catching up…'
    } catch (err) {
      if (s.stop.signal.aborted) return
      if (err instanceof ApiError && err.status === 401) return signOut('Your key is no longer valid; sign in again.')
      failures++
      connection.textContent = 'reconnecting…'
      await sleep(Math.min(30_000, 1_000 * 2 ** Math.min(failures, 5)))
    }
  }
}

function handle (s: Session, event: FeedEvent, live: boolean): void {
  // Each case narrows the event union (the generated client's types), so data needs no casts.
  switch (event.type) {
    case 'message.received': {
      const message = event.data.message
      const { conversation, added } = s.conversations.add(message)
      if (isGroupId(conversation.id) && conversation.title === conversation.id) void nameGroup(s, conversation.id)
      // Replayed events are counted already: the unread counts come from the server (syncUnread).
      if (!added || message.sender === s.me || !live) break
      if (s.active !== conversation.id || document.visibilityState !== 'visible') {
        conversation.unread++
        report(s, message, 'delivered')
      }
      // Shown in the open conversation: marked read as it renders (markShown).
      refresh(conversation.id)
      break
    }
    case 'message.edited': {
      // The message as it now is: in its place if loaded, and for the quotes of replies to it.
      const message = event.data.message
      const conversation = s.conversations.replace(message)
      if (s.originals.has(message.id)) s.originals.set(message.id, Promise.resolve(message))
      if (conversation !== undefined && live) refresh(conversation.id)
      break
    }
    case 'message.reaction': {
      // Replayed ones are in the history already loaded (or to be loaded).
      if (live) void refetchReactions(s, event.data.message)
      break
    }
    case 'message.status': {
      s.conversations.setStatus(event.data.message, event.data.recipient, event.data.status)
      if (live) updateTicks(event.data.message)
      break
    }
    case 'message.deleted': {
      const conversation = s.conversations.remove(event.data.message)
      if (conversation !== undefined && live) refresh(conversation.id)
      break
    }
    case 'typing.started':
    case 'typing.stopped': {
      const { to, from } = event.data
      const conversation = s.conversations.get(isGroupId(to) ? to : from)
      if (event.type === 'typing.started') conversation.typing.set(from, Date.parse(event.data.expiresAt))
      else conversation.typing.delete(from)
      if (live) renderTyping()
      break
    }
    case 'group.created':
    case 'group.updated': {
      const group = event.data.group
      s.conversations.get(group.id).title = group.name
      if (live) renderConversations()
      break
    }
    case 'group.deleted': {
      const conversation = s.conversations.get(event.data.group)
      conversation.title = `${conversation.title} (deleted)`
      if (live) renderConversations()
      break
    }
  }
}
