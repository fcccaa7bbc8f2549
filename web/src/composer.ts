import { describe } from './api.js'
import { isGroupId } from './conversations.js'
import { bodyInput, composer, fileInput, recipientInput, sendError } from './page.js'
import { open, updateTicks } from './render.js'
import { currentSession, type Session } from './session.js'

const TYPING_EVERY_MS = 5_000

/** Sends what the composer holds (text and attached files), then opens its conversation. */
export async function send (): Promise<void> {
  const s = currentSession()
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
