import type { DeliveryStatus, Message } from './types.js'

export interface Conversation {
  /** The peer's address, or the group id. */
  id: string
  title: string
  messages: Map<string, Message>
  /** Whether its newest page of history has been fetched. */
  loaded: boolean
  /** Where the next older page of history starts (the history route's `next`); null at its start. */
  older: string | null
  /** The newest message from others the reader has been shown and reported read. */
  readUpTo: string
  unread: number
  /**
   * Where the "new messages" divider goes while the conversation is open: above the `count`th
   * newest message from others among those up to `upTo` (the newest when it was opened, so
   * messages arriving while it is open move nothing).
   */
  newMessages: { count: number, upTo: string } | undefined
  /** Who is typing here, and until when (epoch ms). */
  typing: Map<string, number>
  lastAt: string
}

const RANK: Record<DeliveryStatus, number> = { sent: 0, delivered: 1, read: 2 }

export const isGroupId = (id: string): boolean => id.startsWith('grp_')

/** The conversation a message belongs to, seen by `me`. */
function conversationOf (message: Message, me: string): string {
  if (isGroupId(message.recipient)) return message.recipient
  return message.sender === me ? message.recipient : message.sender
}

/** Conversations, messages and the delivery status of one's own messages. */
export class Conversations {
  private readonly byId = new Map<string, Conversation>()
  /** Own message id → recipient → status. */
  private readonly statuses = new Map<string, Map<string, DeliveryStatus>>()

  constructor (readonly me: string) {}

  get (id: string): Conversation {
    let found = this.byId.get(id)
    if (found === undefined) {
      found = { id, title: id, messages: new Map(), loaded: false, older: null, readUpTo: '', unread: 0, newMessages: undefined, typing: new Map(), lastAt: '' }
      this.byId.set(id, found)
    }
    return found
  }

  has (id: string): boolean { return this.byId.has(id) }

  /** Most recently active first. */
  list (): Conversation[] {
    return [...this.byId.values()].sort((a, b) => b.lastAt.localeCompare(a.lastAt) || a.title.localeCompare(b.title))
  }

  /** Adds a message; answers its conversation, and whether the message is new. */
  add (message: Message): { conversation: Conversation, added: boolean } {
    const conversation = this.get(conversationOf(message, this.me))
    const added = !conversation.messages.has(message.id)
    conversation.messages.set(message.id, message)
    if (message.createdAt > conversation.lastAt) conversation.lastAt = message.createdAt
    return { conversation, added }
  }

  /** A message wherever it is loaded, or undefined. */
  find (messageId: string): Message | undefined {
    for (const conversation of this.byId.values()) {
      const found = conversation.messages.get(messageId)
      if (found !== undefined) return found
    }
    return undefined
  }

  /** Puts a newer state of a loaded message in its place (an edit, reactions); answers its conversation, undefined if not loaded. */
  replace (message: Message): Conversation | undefined {
    for (const conversation of this.byId.values()) {
      if (conversation.messages.has(message.id)) {
        conversation.messages.set(message.id, message)
        return conversation
      }
    }
    return undefined
  }

  remove (messageId: string): Conversation | undefined {
    for (const conversation of this.byId.values()) {
      if (conversation.messages.delete(messageId)) return conversation
    }
    return undefined
  }

  /** A conversation's messages, oldest first. */
  thread (id: string): Message[] {
    return [...this.get(id).messages.values()].sort((a, b) => a.createdAt.localeCompare(b.createdAt) || a.id.localeCompare(b.id))
  }

  /** Records a recipient's status of an own message; it only moves forward. */
  setStatus (messageId: string, recipient: string, status: DeliveryStatus): void {
    const recipients = this.statuses.get(messageId) ?? new Map<string, DeliveryStatus>()
    const before = recipients.get(recipient)
    if (before === undefined || RANK[status] > RANK[before]) recipients.set(recipient, status)
    this.statuses.set(messageId, recipients)
  }

  /** An own message's status: the least advanced of its recipients' ("read" once all have read). */
  status (messageId: string): DeliveryStatus {
    const recipients = [...(this.statuses.get(messageId)?.values() ?? [])]
    if (recipients.length === 0) return 'sent'
    return recipients.reduce((least, s) => RANK[s] < RANK[least] ? s : least)
  }
}
