import { describe } from './api.js'
import { sendError } from './page.js'
import { refresh, renderThread } from './render.js'
import { currentSession, type Session } from './session.js'
import type { Message } from './types.js'

/** The picker's few common emoji; any other reaction someone made still shows and toggles. */
export const PICKER = ['👍', '❤️', '😂', '😮', '😢', '🎉']

/** Opens the reaction picker under a message, or closes it (one open at a time). */
export function togglePicker (messageId: string): void {
  const s = currentSession()
  if (s === undefined) return
  s.pickerFor = s.pickerFor === messageId ? undefined : messageId
  renderThread()
}

/** The message with one's own reaction `emoji` added or taken back (most used first, as the server orders them). */
function withOwnReaction (m: Message, emoji: string, on: boolean): Message {
  const reactions = m.reactions.map((r) => ({ ...r }))
  const found = reactions.find((r) => r.emoji === emoji)
  if (on && found === undefined) reactions.push({ emoji, count: 1, mine: true })
  else if (found !== undefined && found.mine !== on) {
    found.count += on ? 1 : -1
    found.mine = on
  }
  return { ...m, reactions: reactions.filter((r) => r.count > 0).sort((a, b) => b.count - a.count) }
}

/** Adds one's reaction, or takes it back if it is there: shown at once, undone if the server refuses. */
export async function toggleReaction (s: Session, m: Message, emoji: string): Promise<void> {
  const current = s.conversations.find(m.id) ?? m
  const on = current.reactions.find((r) => r.emoji === emoji)?.mine !== true
  const apply = (on: boolean) => {
    const latest = s.conversations.find(m.id)
    const conversation = latest === undefined ? undefined : s.conversations.replace(withOwnReaction(latest, emoji, on))
    if (conversation !== undefined) refresh(conversation.id)
  }
  sendError.textContent = ''
  apply(on)
  try {
    await s.api.react(m.id, emoji, on)
  } catch (err) {
    if (currentSession() !== s) return
    apply(!on)
    sendError.textContent = `Could not ${on ? 'add' : 'take back'} the reaction: ${describe(err)}`
  }
}

/**
 * Someone else reacted (message.reaction): the message is read again for its counts, rather than
 * a count moved by the event, which could count twice one that a page of history fetched at the
 * same moment already holds. One read at a time per message; another event meanwhile reads again.
 */
export async function refetchReactions (s: Session, messageId: string): Promise<void> {
  if (s.conversations.find(messageId) === undefined) return
  if (s.refetching.has(messageId)) {
    s.refetching.set(messageId, true)
    return
  }
  s.refetching.set(messageId, false)
  try {
    do {
      s.refetching.set(messageId, false)
      const fresh = await s.api.message(messageId).catch(() => undefined)
      if (fresh === undefined || currentSession() !== s) return
      const conversation = s.conversations.replace(fresh)
      if (conversation !== undefined) refresh(conversation.id)
    } while (s.refetching.get(messageId) === true)
  } finally {
    s.refetching.delete(messageId)
  }
}
