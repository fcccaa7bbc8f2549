/** The API's objects, as API.md §3 describes them. */
export interface User { address: string, displayName: string | null, bot: boolean, createdAt: string }
export interface Attachment { index: number, filename: string, contentType: string, size: number }
export interface Message { id: string, sender: string, recipient: string, body: string, attachments: Attachment[], createdAt: string }
export interface Group { id: string, name: string, owner: string, members: string[], createdAt: string, updatedAt: string }
export type DeliveryStatus = 'sent' | 'delivered' | 'read'
export interface FeedEvent { id: string, type: string, createdAt: string, data: Record<string, unknown> }
export interface Whoami { user: User, keyId: string, dailyQuota: number }
export interface RosterEntry { entity: string, type: 'user' | 'group', name: string | null, addedAt: string }
export interface MessageStatus { message: string, recipients: { address: string, status: DeliveryStatus, updatedAt: string }[] }
export interface SearchAnswer { results: { type: string, message?: Message }[], nextCursor: string | null }
