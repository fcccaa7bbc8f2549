import { describe } from './api.js'
import { isGroupId, type Conversation } from './conversations.js'
import { el, formatSize, formatTime } from './dom.js'
import { conversationList, messageList, recipientInput, sendError, threadTitle, typingLine } from './page.js'
import { markShown } from './receipts.js'
import { currentSession, type Session } from './session.js'
import type { DeliveryStatus, Message } from './types.js'

// What the console shows of the session: the conversation list, the open conversation's
// messages (with their ticks and attachments) and who is typing there; and opening one.

const TICKS: Record<DeliveryStatus, string> = { sent: '✓', delivered: '✓✓', read: '✓✓' }

/** Re-renders what a change to one conversation shows. */
export function refresh (id: string): void {
  renderConversations()
  if (currentSession()?.active === id) renderThread()
}

export function renderConversations (): void {
  const s = currentSession()
  if (s === undefined) return
  conversationList.replaceChildren(...s.conversations.list().map((c) => {
    const item = el('li', { 'data-testid': 'conversation', 'data-id': c.id, class: c.id === s.active ? 'active' : '' },
      c.title, c.unread > 0 ? el('span', { class: 'unread' }, String(c.unread)) : undefined)
    item.addEventListener('click', () => { void open(c.id) })
    return item
  }))
}

export async function open (id: string): Promise<void> {
  const s = currentSession()
  if (s === undefined) return
  s.active = id
  const conversation = s.conversations.get(id)
  conversation.unread = 0
  recipientInput.value = id
  threadTitle.textContent = conversation.title
  renderConversations()
  renderThread()
  if (!conversation.loaded) {
    conversation.loaded = true
    await loadHistory(s, conversation)
  }
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
  messageList.replaceChildren(...messages.map((m) => renderMessage(s, m)))
  if (document.visibilityState === 'visible') markShown(s, conversation)
  if (nearBottom || messages.length < 20) messageList.scrollTop = messageList.scrollHeight
  renderTyping()
}

function renderMessage (s: Session, m: Message): HTMLLIElement {
  const mine = m.sender === s.me
  const attributes: Record<string, string> = { 'data-testid': 'message', 'data-id': m.id, class: mine ? 'mine' : '' }
  if (mine) attributes['data-status'] = s.conversations.status(m.id)
  const from = mine || !isGroupId(m.recipient) ? undefined : el('b', {}, `${m.sender}: `)
  const meta = el('span', { class: 'meta' }, formatTime(m.createdAt),
    mine ? el('span', { class: 'ticks', title: s.conversations.status(m.id) }, TICKS[s.conversations.status(m.id)]) : undefined)
  return el('li', attributes, from, el('span', { class: 'body' }, m.body), ...m.attachments.map((a) => renderAttachment(s, m, a)), meta)
}

function attachmentUrl (s: Session, m: Message, index: number): Promise<string> {
  const key = `${m.id}/${index}`
  let url = s.blobs.get(key)
  if (url === undefined) {
    url = s.api.attachment(m.id, index).then((blob) => URL.createObjectURL(blob))
    url.catch(() => s.blobs.delete(key))
    s.blobs.set(key, url)
  }
  return url
}

function renderAttachment (s: Session, m: Message, a: Message['attachments'][number]): HTMLElement {
  if (a.contentType.startsWith('image/')) {
    const img = el('img', { alt: a.filename, 'data-testid': 'thumbnail' })
    void attachmentUrl(s, m, a.index).then((url) => { img.src = url }).catch(() => { img.alt = `${a.filename} (could not load)` })
    return img
  }
  const link = el('a', { class: 'file', href: '#', 'data-testid': 'file' }, `Download ${a.filename} (${formatSize(a.size)})`)
  link.addEventListener('click', (event) => {
    event.preventDefault()
    void attachmentUrl(s, m, a.index).then((url) => {
      const save = el('a', { href: url, download: a.filename })
      save.click()
    })
  })
  return link
}

export function updateTicks (messageId: string): void {
  const s = currentSession()
  if (s === undefined) return
  const item = messageList.querySelector<HTMLElement>(`li[data-id="${CSS.escape(messageId)}"]`)
  if (item === null) return
  const status = s.conversations.status(messageId)
  item.dataset.status = status
  const ticks = item.querySelector('.ticks')
  if (ticks !== null) {
    ticks.textContent = TICKS[status]
    ticks.setAttribute('title', status)
  }
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
    if (currentSession() === s && s.active === conversation.id) messageList.scrollTop = messageList.scrollHeight - before
  } finally {
    loadingOlder = false
  }
}
