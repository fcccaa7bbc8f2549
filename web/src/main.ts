import { ApiError, createApi, type Api, type Credentials } from './api.js'
import { Conversations, isGroupId, type Conversation } from './conversations.js'
import { byId, el, formatSize, formatTime } from './dom.js'
import { clearCredentials, loadCredentials, saveCredentials } from './session.js'
import type { DeliveryStatus, FeedEvent, Message } from './types.js'

const TICKS: Record<DeliveryStatus, string> = { sent: '✓', delivered: '✓✓', read: '✓✓' }
const TYPING_EVERY_MS = 5_000

const signInView = byId('sign-in-view')
const consoleView = byId('console-view')
const signInForm = byId<HTMLFormElement>('sign-in-form')
const signInError = byId('sign-in-error')
const conversationList = byId<HTMLUListElement>('conversations')
const messageList = byId<HTMLOListElement>('messages')
const threadTitle = byId('thread-title')
const typingLine = byId('typing')
const composer = byId<HTMLFormElement>('composer')
const recipientInput = composer.elements.namedItem('recipient') as HTMLInputElement
const bodyInput = composer.elements.namedItem('body') as HTMLTextAreaElement
const fileInput = composer.elements.namedItem('attachment') as HTMLInputElement
const sendError = byId('send-error')
const connection = byId('connection')

/** Everything that lives while signed in; replaced on each sign-in. */
interface Session {
  api: Api
  me: string
  conversations: Conversations
  active: string | undefined
  /** The events feed position. */
  after: string
  stop: AbortController
  /** Incoming messages already reported read, so each is reported once. */
  reportedRead: Set<string>
  /** Attachment object URLs, by message id and index. */
  blobs: Map<string, Promise<string>>
  typingSentAt: number
  typingTo: string | undefined
}

let session: Session | undefined

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))
const describe = (err: unknown) => err instanceof Error ? err.message : String(err)

// Status reports go out one at a time, so catching up on many messages stays well inside the
// key's rate limit.
let reports: Promise<void> = Promise.resolve()
function report (s: Session, message: Message, status: 'delivered' | 'read'): void {
  if (message.sender === s.me) return
  if (status === 'read') {
    if (s.reportedRead.has(message.id)) return
    s.reportedRead.add(message.id)
  }
  reports = reports.then(async () => {
    if (session !== s) return
    await s.api.report(message.id, status).catch(() => {})
    await sleep(100)
  })
}

function showSignIn (error = ''): void {
  consoleView.hidden = true
  signInView.hidden = false
  signInError.textContent = error
}

async function signIn (credentials: Credentials): Promise<void> {
  const api = createApi(credentials)
  let whoami
  try {
    whoami = await api.whoami()
  } catch (err) {
    clearCredentials()
    showSignIn(err instanceof ApiError && err.status === 401 ? 'Wrong key id or secret, or the key was revoked.' : `Could not sign in: ${describe(err)}`)
    return
  }
  saveCredentials(credentials)
  const me = whoami.user.address
  const s: Session = {
    api,
    me,
    conversations: new Conversations(me),
    active: undefined,
    after: '0',
    stop: new AbortController(),
    reportedRead: new Set(),
    blobs: new Map(),
    typingSentAt: 0,
    typingTo: undefined
  }
  session = s
  byId('signed-in-as').textContent = me
  signInView.hidden = true
  consoleView.hidden = false
  signInForm.reset()

  const roster = await api.roster().catch(() => ({ entries: [] }))
  for (const entry of roster.entries) {
    const conversation = s.conversations.get(entry.entity)
    conversation.title = entry.name ?? entry.entity
    if (entry.type === 'group' && entry.name === null) void nameGroup(s, entry.entity)
  }
  renderConversations()
  void follow(s)
}

function signOut (reason = ''): void {
  if (session !== undefined) {
    session.stop.abort()
    for (const url of session.blobs.values()) void url.then((u) => URL.revokeObjectURL(u)).catch(() => {})
  }
  session = undefined
  clearCredentials()
  conversationList.replaceChildren()
  messageList.replaceChildren()
  typingLine.textContent = ''
  threadTitle.textContent = 'No conversation open'
  composer.reset()
  showSignIn(reason)
}

async function nameGroup (s: Session, id: string): Promise<void> {
  const group = await s.api.group(id).catch(() => undefined)
  if (group === undefined || session !== s) return
  s.conversations.get(id).title = group.name
  renderConversations()
  if (s.active === id) threadTitle.textContent = group.name
}

/**
 * Reads the feed from the start, then follows it live until sign-out: over the event stream
 * (Server-Sent Events), or by long-polling where the server or a proxy offers no stream.
 */
async function follow (s: Session): Promise<void> {
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
      if (!added || message.sender === s.me) break
      if (s.active === conversation.id && document.visibilityState === 'visible' && live) report(s, message, 'read')
      else {
        conversation.unread++
        if (live) report(s, message, 'delivered')
      }
      if (live) refresh(conversation.id)
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

/** Re-renders what a change to one conversation shows. */
function refresh (id: string): void {
  renderConversations()
  if (session?.active === id) renderThread()
}

function renderConversations (): void {
  const s = session
  if (s === undefined) return
  conversationList.replaceChildren(...s.conversations.list().map((c) => {
    const item = el('li', { 'data-testid': 'conversation', 'data-id': c.id, class: c.id === s.active ? 'active' : '' },
      c.title, c.unread > 0 ? el('span', { class: 'unread' }, String(c.unread)) : undefined)
    item.addEventListener('click', () => { void open(c.id) })
    return item
  }))
}

async function open (id: string): Promise<void> {
  const s = session
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

async function loadHistory (s: Session, conversation: Conversation): Promise<void> {
  try {
    const page = await s.api.conversation(conversation.id)
    for (const result of page.results) if (result.type === 'message') s.conversations.add(result.message)
    // Delivery status of own messages, newest few.
    const own = s.conversations.thread(conversation.id).filter((m) => m.sender === s.me).slice(-20)
    await Promise.all(own.map(async (m) => {
      const status = await s.api.status(m.id).catch(() => undefined)
      for (const r of status?.recipients ?? []) s.conversations.setStatus(m.id, r.address, r.status)
    }))
  } catch (err) {
    sendError.textContent = `Could not load the conversation: ${describe(err)}`
  }
  if (session === s && s.active === conversation.id) renderThread()
}

function renderThread (): void {
  const s = session
  if (s === undefined || s.active === undefined) return
  const nearBottom = messageList.scrollHeight - messageList.scrollTop - messageList.clientHeight < 80
  const messages = s.conversations.thread(s.active)
  messageList.replaceChildren(...messages.map((m) => renderMessage(s, m)))
  if (document.visibilityState === 'visible') for (const m of messages) report(s, m, 'read')
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

function updateTicks (messageId: string): void {
  const s = session
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
function renderTyping (): void {
  const s = session
  clearTimeout(typingTimer)
  if (s === undefined || s.active === undefined) return
  const now = Date.now()
  const typing = s.conversations.get(s.active).typing
  for (const [who, until] of typing) if (until <= now) typing.delete(who)
  const who = [...typing.keys()]
  typingLine.textContent = who.length === 0 ? '' : `${who.join(', ')} ${who.length === 1 ? 'is' : 'are'} typing…`
  if (who.length > 0) typingTimer = setTimeout(renderTyping, Math.min(...typing.values()) - now + 50)
}

async function send (): Promise<void> {
  const s = session
  if (s === undefined) return
  sendError.textContent = ''
  const recipient = recipientInput.value.trim()
  const form = new FormData()
  form.append('recipient', isGroupId(recipient) ? recipient : recipient.toLowerCase())
  form.append('body', bodyInput.value)
  for (const file of fileInput.files ?? []) form.append('attachment', file, file.name)
  const button = composer.querySelector('button')
  if (button !== null) button.disabled = true
  try {
    const message = await s.api.send(form)
    bodyInput.value = ''
    fileInput.value = ''
    void stopTyping(s)
    const { conversation } = s.conversations.add(message)
    if (isGroupId(message.recipient)) {
      void s.api.status(message.id).then((status) => {
        for (const r of status.recipients) s.conversations.setStatus(message.id, r.address, r.status)
        updateTicks(message.id)
      }).catch(() => {})
    }
    await open(conversation.id)
  } catch (err) {
    sendError.textContent = describe(err)
  } finally {
    if (button !== null) button.disabled = false
  }
}

async function stopTyping (s: Session): Promise<void> {
  const to = s.typingTo
  s.typingTo = undefined
  s.typingSentAt = 0
  if (to !== undefined) await s.api.stopTyping(to).catch(() => {})
}

function typed (): void {
  const s = session
  if (s === undefined) return
  const recipient = recipientInput.value.trim()
  if (bodyInput.value === '' || recipient === '') {
    void stopTyping(s)
    return
  }
  if (Date.now() - s.typingSentAt < TYPING_EVERY_MS && s.typingTo === recipient) return
  s.typingSentAt = Date.now()
  s.typingTo = recipient
  void s.api.typing(recipient).catch(() => {})
}

signInForm.addEventListener('submit', (event) => {
  event.preventDefault()
  const data = new FormData(signInForm)
  signInError.textContent = ''
  void signIn({ keyId: String(data.get('keyId') ?? '').trim(), secret: String(data.get('secret') ?? '') })
})
byId('sign-out').addEventListener('click', () => signOut())
composer.addEventListener('submit', (event) => {
  event.preventDefault()
  void send()
})
bodyInput.addEventListener('input', typed)
bodyInput.addEventListener('keydown', (event) => {
  if (event.key === 'Enter' && !event.shiftKey) {
    event.preventDefault()
    composer.requestSubmit()
  }
})
document.addEventListener('visibilitychange', () => { if (document.visibilityState === 'visible') renderThread() })

const stored = loadCredentials()
if (stored !== undefined) void signIn(stored)
else showSignIn()
