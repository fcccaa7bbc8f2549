import type { Api, Credentials } from './api.js'
import { Conversations } from './conversations.js'
import type { Message } from './types.js'
import { composer, composing, consoleView, conversationList, sendButton, messageList, signInError, signInView, threadTitle, typingLine } from './page.js'

// sessionStorage: the secret lives only as long as this tab, never in a URL or localStorage.
const KEY = 'parley.credentials'

export function loadCredentials (): Credentials | undefined {
  try {
    const stored = JSON.parse(sessionStorage.getItem(KEY) ?? 'null') as Partial<Credentials> | null
    return typeof stored?.keyId === 'string' && typeof stored.secret === 'string' ? { keyId: stored.keyId, secret: stored.secret } : undefined
  } catch {
    return undefined
  }
}

export function saveCredentials (credentials: Credentials): void {
  sessionStorage.setItem(KEY, JSON.stringify(credentials))
}

export function clearCredentials (): void {
  sessionStorage.removeItem(KEY)
}

/** Everything that lives while signed in; replaced on each sign-in. */
export interface Session {
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
  /** Messages replied to that are not in a loaded page, fetched once each; undefined once deleted or out of reach. */
  originals: Map<string, Promise<Message | undefined>>
  /** What the composer is doing besides a new message: answering one, or editing one's own. */
  composing: { kind: 'reply' | 'edit', message: Message } | undefined
  /** The message whose reaction picker is open. */
  pickerFor: string | undefined
  /** Messages being fetched again after a reaction event, and whether another came in meanwhile. */
  refetching: Map<string, boolean>
}

let session: Session | undefined

/**
 * The signed-in session, or undefined. Work that outlives an await checks it is still the one it
 * began with, so nothing from a previous sign-in lands on the page.
 */
export function currentSession (): Session | undefined {
  return session
}

/** Begins the session of `me`, in place of any before it. */
export function startSession (api: Api, me: string): Session {
  session = {
    api,
    me,
    conversations: new Conversations(me),
    active: undefined,
    after: '0',
    stop: new AbortController(),
    reportedRead: new Set(),
    blobs: new Map(),
    typingSentAt: 0,
    typingTo: undefined,
    originals: new Map(),
    composing: undefined,
    pickerFor: undefined,
    refetching: new Map()
  }
  return session
}

export function showSignIn (error = ''): void {
  consoleView.hidden = true
  signInView.hidden = false
  signInError.textContent = error
}

export function signOut (reason = ''): void {
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
  composing.hidden = true
  sendButton.textContent = 'Send'
  consoleView.dataset.view = 'list'
  showSignIn(reason)
}
