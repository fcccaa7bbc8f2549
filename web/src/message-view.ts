import { ApiError } from './api.js'
import { startEditing, startReplying } from './composer.js'
import { isGroupId } from './conversations.js'
import { formatDateTime, formatTime } from './dates.js'
import { el, formatSize } from './dom.js'
import { PICKER, togglePicker, toggleReaction } from './reactions.js'
import type { Session } from './session.js'
import type { DeliveryStatus, Message } from './types.js'

// One message as the thread shows it: who (in a group), what it answers, its text and files,
// its reactions, when (and whether edited), its ticks, and what one can do with it.

const TICKS: Record<DeliveryStatus, string> = { sent: '✓', delivered: '✓✓', read: '✓✓' }
const QUOTE_CHARS = 90

export function renderMessage (s: Session, m: Message): HTMLLIElement {
  const mine = m.sender === s.me
  const attributes: Record<string, string> = { 'data-testid': 'message', 'data-id': m.id, class: mine ? 'mine' : 'theirs' }
  if (mine) attributes['data-status'] = s.conversations.status(m.id)
  const from = mine || !isGroupId(m.recipient) ? undefined : el('b', {}, `${m.sender}: `)
  const meta = el('span', { class: 'meta' },
    el('time', { datetime: m.createdAt, title: formatDateTime(m.createdAt) }, formatTime(m.createdAt)),
    m.editedAt === null ? undefined : el('span', { class: 'edited', 'data-testid': 'edited', title: `Edited ${formatDateTime(m.editedAt)}` }, 'edited'),
    mine ? el('span', { class: 'ticks', title: s.conversations.status(m.id) }, TICKS[s.conversations.status(m.id)]) : undefined)
  return el('li', attributes,
    renderQuote(s, m),
    from,
    el('span', { class: 'body' }, m.body),
    ...m.attachments.map((a) => renderAttachment(s, m, a)),
    renderReactions(s, m),
    el('div', { class: 'foot' }, meta, renderActions(s, m)),
    s.pickerFor === m.id ? renderPicker(s, m) : undefined)
}

export function renderTicks (item: HTMLElement, status: DeliveryStatus): void {
  item.dataset.status = status
  const ticks = item.querySelector('.ticks')
  if (ticks !== null) {
    ticks.textContent = TICKS[status]
    ticks.setAttribute('title', status)
  }
}

/** A few words of a message, for a quote or the composer's "replying to". */
export function snippet (m: Message): string {
  const text = m.body.trim().replace(/\s+/g, ' ') || m.attachments.map((a) => a.filename).join(', ')
  return text.length > QUOTE_CHARS ? `${text.slice(0, QUOTE_CHARS - 1)}…` : text
}

/** The message this one answers: from what is loaded, else fetched once (it may be older, or deleted since). */
function renderQuote (s: Session, m: Message): HTMLElement | undefined {
  if (m.replyTo === null) return undefined
  const quote = el('blockquote', { class: 'quote', 'data-testid': 'quote' })
  const fill = (original: Message | undefined) => {
    if (original === undefined) quote.replaceChildren(el('i', {}, 'The original message was deleted'))
    else quote.replaceChildren(el('b', {}, original.sender === s.me ? 'You' : original.sender), ' ', snippet(original))
  }
  const loaded = s.conversations.find(m.replyTo)
  if (loaded !== undefined) {
    fill(loaded)
    return quote
  }
  quote.textContent = '…'
  const id = m.replyTo
  let original = s.originals.get(id)
  if (original === undefined) {
    // Gone (404) or no longer readable (403): deleted. Anything else may pass: asked again next time.
    original = s.api.message(id).catch((err: unknown) => {
      if (err instanceof ApiError && (err.status === 404 || err.status === 403)) return undefined
      s.originals.delete(id)
      throw err
    })
    s.originals.set(id, original)
  }
  original.then(fill, () => { quote.textContent = 'The original message could not be loaded' })
  return quote
}

function renderReactions (s: Session, m: Message): HTMLElement | undefined {
  if (m.reactions.length === 0) return undefined
  return el('div', { class: 'reactions' }, ...m.reactions.map((r) => {
    const button = el('button', {
      type: 'button',
      class: r.mine ? 'reaction mine' : 'reaction',
      'data-testid': 'reaction',
      'data-emoji': r.emoji,
      'aria-pressed': String(r.mine),
      'aria-label': `${r.emoji} ${r.count}${r.mine ? ', yours: take it back' : ': add yours'}`
    }, `${r.emoji} ${r.count}`)
    button.addEventListener('click', () => { void toggleReaction(s, m, r.emoji) })
    return button
  }))
}

function action (label: string, text: string, testId: string, act: () => void, extra: Record<string, string> = {}): HTMLButtonElement {
  const button = el('button', { type: 'button', 'aria-label': label, title: label, 'data-testid': testId, ...extra }, text)
  button.addEventListener('click', act)
  return button
}

function renderActions (s: Session, m: Message): HTMLElement {
  return el('span', { class: 'actions' },
    action('Reply', '↩', 'reply', () => startReplying(m)),
    action('Add a reaction', '☺', 'react', () => togglePicker(m.id), { 'aria-expanded': String(s.pickerFor === m.id) }),
    m.sender === s.me && m.body !== '' ? action('Edit', '✎', 'edit', () => startEditing(m)) : undefined)
}

function renderPicker (s: Session, m: Message): HTMLElement {
  return el('div', { class: 'picker', role: 'group', 'aria-label': 'Pick a reaction' }, ...PICKER.map((emoji) =>
    action(`React with ${emoji}`, emoji, 'pick-reaction', () => {
      togglePicker(m.id)
      void toggleReaction(s, m, emoji)
    }, { 'data-emoji': emoji })))
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
