import { describe } from './api.js'
import { cancelComposing } from './composer.js'
import type { Conversation } from './conversations.js'
import { dayKey, dayLabel, formatDateTime, formatWhen } from './dates.js'
import { el } from './dom.js'
import { renderMessage, renderTicks } from './message-view.js'
import { consoleView, conversationList, messageList, recipientInput, sendError, threadTitle, typingLine } from './page.js'
import { markShown } from './receipts.js'
import { currentSession, type Session } from './session.js'
import type { Message } from './types.js'

// What the console shows of the session: the conversation list, the open conversation's
// messages (by day, with where the new ones begin) and who is typing there; opening one, and on
// a narrow screen going back from it to the list.

/** Re-renders what a change to one conversation shows. */
export function refresh (id: string): void {
  renderConversations()
  if (currentSession()?.active === id) renderThread()
}

export function renderConversations (): void {
  const s = currentSession()
  if (s === undefined) return
  const now = new Date()
  conversationList.replaceChildren(...s.conversations.list().map((c) => {
    // A button inside the item: reachable and pressable from the keyboard, named by its text.
    const button = el('button', { type: 'button', 'aria-current': String(c.id === s.active) },
      el('span', { class: 'title' }, c.title),
      c.lastAt === '' ? undefined : el('time', { datetime: c.lastAt, title: formatDateTime(c.lastAt) }, formatWhen(c.lastAt, now)),
      c.unread > 0 ? el('span', { class: 'unread', 'aria-label': `${c.unread} unread` }, String(c.unread)) : undefined)
    button.addEventListener('click', () => { void open(c.id) })
    return el('li', { 'data-testid': 'conversation', 'data-id': c.id, class: c.id === s.active ? 'active' : '' }, button)
  }))
}

/** On a narrow screen, shows the conversation list or the thread (a wide one shows both). */
function showView (view: 'list' | 'thread'): void {
  consoleView.dataset.view = view
}

/** Back to the list from a conversation: none is open, so what arrives there counts as unread. */
export function showList (): void {
  const s = currentSession()
  if (s === undefined) return
  s.active = undefined
  showView('list')
  renderConversations()
}

/** An empty composer for a conversation not in the list yet. */
export function newConversation (): void {
  const s = currentSession()
  if (s === undefined) return
  cancelComposing()
  s.active = undefined
  recipientInput.value = ''
  threadTitle.textContent = 'New conversation'
  messageList.replaceChildren()
  typingLine.textContent = ''
  showView('thread')
  renderConversations()
  recipientInput.focus()
}

export async function open (id: string): Promise<void> {
  const s = currentSession()
  if (s === undefined) return
  if (s.composing !== undefined && !s.conversations.get(id).messages.has(s.composing.message.id)) cancelComposing()
  const changed = s.active !== id
  s.active = id
  s.pickerFor = undefined
  const conversation = s.conversations.get(id)
  const unread = conversation.unread
  conversation.unread = 0
  if (changed) conversation.newMessages = undefined
  recipientInput.value = id
  threadTitle.textContent = conversation.title
  showView('thread')
  renderConversations()
  renderThread()
  if (!conversation.loaded) {
    conversation.loaded = true
    await loadHistory(s, conversation)
  }
  // Where the unread ones begin, counted in what was there when it opened.
  if (unread > 0 && currentSession() === s && s.active === id) {
    conversation.newMessages = { count: unread, upTo: s.conversations.thread(id).at(-1)?.id ?? '' }
    renderThread()
  }
}

/** The first unread message when the conversation was opened; undefined when none, or above what is loaded. */
function firstUnread (s: Session, conversation: Conversation, messages: Message[]): string | undefined {
  const mark = conversation.newMessages
  if (mark === undefined) return undefined
  const upTo = messages.findIndex((m) => m.id === mark.upTo)
  const theirs = messages.slice(0, upTo + 1).filter((m) => m.sender !== s.me)
  if (theirs.length < mark.count && conversation.older !== null) return undefined
  return theirs[Math.max(0, theirs.length - mark.count)]?.id
}

/** Loads the conversation's newest page of history, or (`older`) the page before what is shown. */
async function loadHistory (s: Session, conversation: Conversation, older = false): Promise<void> {
  try {
    const page = await s.api.history(conversation.id, older ? conversation.older ?? undefined : undefined)
    for (const message of page.messages) s.conversations.add(message)
    conversation.older = page.next
    // Delivery status of own messages, newest few.
    const own = s.conversations.thread(conversation.id).filter((m) => m.sender === s.me).slice(-20)
    await Promise.all(own.map(async (m) => {
      const status = await s.api.status(m.id).catch(() => undefined)
      for (const r of status?.recipients ?? []) s.conversations.setStatus(m.id, r.address, r.status)
    }))
  } catch (err) {
    sendError.textContent = `Could not load the conversation: ${describe(err)}`
  }
  if (currentSession() === s && s.active === conversation.id) renderThread()
}

export function renderThread (): void {
  const s = currentSession()
  if (s === undefined || s.active === undefined) return
  const nearBottom = messageList.scrollHeight - messageList.scrollTop - messageList.clientHeight < 80
  const conversation = s.conversations.get(s.active)
  const messages = s.conversations.thread(s.active)
  const divider = firstUnread(s, conversation, messages)
  const now = new Date()
  const items: HTMLLIElement[] = []
  let day = ''
  for (const m of messages) {
    if (dayKey(m.createdAt) !== day) {
      day = dayKey(m.createdAt)
      items.push(el('li', { class: 'day', role: 'separator', 'data-testid': 'day-separator' },
        el('time', { datetime: day }, dayLabel(m.createdAt, now))))
    }
    if (m.id === divider) items.push(el('li', { class: 'new-messages', role: 'separator', 'data-testid': 'new-messages' }, 'New messages'))
    items.push(renderMessage(s, m))
  }
  messageList.replaceChildren(...items)
  if (nearBottom || messages.length < 20) messageList.scrollTop = messageList.scrollHeight
  if (document.visibilityState === 'visible') markShown(s, conversation)
  renderTyping()
}

export function updateTicks (messageId: string): void {
  const s = currentSession()
  if (s === undefined) return
  const item = messageList.querySelector<HTMLElement>(`li[data-id="${CSS.escape(messageId)}"]`)
  if (item === null) return
  renderTicks(item, s.conversations.status(messageId))
}

let typingTimer: ReturnType<typeof setTimeout> | undefined
export function renderTyping (): void {
  const s = currentSession()
  clearTimeout(typingTimer)
  if (s === undefined || s.active === undefined) return
  const now = Date.now()
  const typing = s.conversations.get(s.active).typing
  for (const [who, until] of typing) if (until <= now) typing.delete(who)
  const who = [...typing.keys()]
  typingLine.textContent = who.length === 0 ? '' : `${who.join(', ')} ${who.length === 1 ? 'is' : 'are'} typing…`
  if (who.length > 0) typingTimer = setTimeout(renderTyping, Math.min(...typing.values()) - now + 50)
}

/** The person scrolled: what came into view is read. */
export function markVisible (): void {
  const s = currentSession()
  if (s !== undefined && s.active !== undefined && document.visibilityState === 'visible') markShown(s, s.conversations.get(s.active))
}

let loadingOlder = false

/** Scrolled to the top of a conversation with more before it: the older page, the view kept where it was. */
export async function loadOlder (): Promise<void> {
  const s = currentSession()
  if (s === undefined || s.active === undefined || loadingOlder) return
  const conversation = s.conversations.get(s.active)
  if (!conversation.loaded || conversation.older === null || messageList.scrollTop > 40) return
  loadingOlder = true
  try {
    const before = messageList.scrollHeight - messageList.scrollTop
    await loadHistory(s, conversation, true)
    if (currentSession() === s && s.active === conversation.id) {
      messageList.scrollTop = messageList.scrollHeight - before
      markShown(s, conversation)
    }
  } finally {
    loadingOlder = false
  }
}
