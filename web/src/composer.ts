import { describe } from './api.js'
import { isGroupId } from './conversations.js'
import { snippet } from './message-view.js'
import { bodyInput, composing, composingText, fileInput, messageList, recipientInput, sendButton, sendError } from './page.js'
import { open, refresh, updateTicks } from './render.js'
import { currentSession, type Session } from './session.js'
import type { Message } from './types.js'

const TYPING_EVERY_MS = 5_000

/** Shows what the composer is doing besides a new message (answering, editing), with a way out. */
function showComposing (s: Session): void {
  const what = s.composing
  composing.hidden = what === undefined
  composingText.textContent = what === undefined
    ? ''
    : `${what.kind === 'edit' ? 'Editing' : `Replying to ${what.message.sender === s.me ? 'yourself' : what.message.sender}`}: ${snippet(what.message)}`
  sendButton.textContent = what?.kind === 'edit' ? 'Save' : 'Send'
}

/** The composer answers `m`: the next send carries replyTo. */
export function startReplying (m: Message): void {
  const s = currentSession()
  if (s === undefined) return
  if (s.composing?.kind === 'edit') bodyInput.value = ''
  s.composing = { kind: 'reply', message: m }
  showComposing(s)
  bodyInput.focus()
}

/** The composer holds one's own message `m` to change it: the next send is its edit. */
export function startEditing (m: Message): void {
  const s = currentSession()
  if (s === undefined) return
  s.composing = { kind: 'edit', message: m }
  bodyInput.value = m.body
  showComposing(s)
  bodyInput.focus()
}

/** Back to a plain new message (the edit's text is dropped, a reply's kept). */
export function cancelComposing (): void {
  const s = currentSession()
  if (s === undefined || s.composing === undefined) return
  if (s.composing.kind === 'edit') bodyInput.value = ''
  s.composing = undefined
  showComposing(s)
}

/** Saves the edit the composer holds (PATCH /v2/message/{id}). */
async function saveEdit (s: Session, original: Message): Promise<void> {
  const edited = await s.api.edit(original.id, bodyInput.value)
  bodyInput.value = ''
  s.composing = undefined
  showComposing(s)
  const conversation = s.conversations.replace(edited)
  if (conversation !== undefined) refresh(conversation.id)
}

/** Sends what the composer holds (text, attached files, what it answers), or saves an edit; then opens its conversation. */
export async function send (): Promise<void> {
  const s = currentSession()
  if (s === undefined) return
  sendError.textContent = ''
  const recipient = recipientInput.value.trim()
  const replyTo = s.composing?.kind === 'reply' ? s.composing.message.id : undefined
  const form = new FormData()
  form.append('recipient', isGroupId(recipient) ? recipient : recipient.toLowerCase())
  form.append('body', bodyInput.value)
  if (replyTo !== undefined) form.append('replyTo', replyTo)
  for (const file of fileInput.files ?? []) form.append('attachment', file, file.name)
  sendButton.disabled = true
  try {
    if (s.composing?.kind === 'edit') return await saveEdit(s, s.composing.message)
    const message = await s.api.send(form)
    bodyInput.value = ''
    fileInput.value = ''
    if (s.composing?.message.id === replyTo) s.composing = undefined
    showComposing(s)
    void stopTyping(s)
    const { conversation } = s.conversations.add(message)
    if (isGroupId(message.recipient)) {
      void s.api.status(message.id).then((status) => {
        for (const r of status.recipients) s.conversations.setStatus(message.id, r.address, r.status)
        updateTicks(message.id)
      }).catch(() => {})
    }
    await open(conversation.id)
    // What one just sent is in view, however far up one had scrolled.
    messageList.scrollTop = messageList.scrollHeight
  } catch (err) {
    sendError.textContent = describe(err)
  } finally {
    sendButton.disabled = false
  }
}

async function stopTyping (s: Session): Promise<void> {
  const to = s.typingTo
  s.typingTo = undefined
  s.typingSentAt = 0
  if (to !== undefined) await s.api.stopTyping(to).catch(() => {})
}

/** Tells the recipient one is typing, at most every few seconds; that one stopped once the text or recipient is cleared. */
export function typed (): void {
  const s = currentSession()
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
