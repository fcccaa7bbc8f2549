import { keyring } from './keyring.js'

/**
 * The identity each sealed record is bound to (its associated data): table, column and the
 * row's key. A ciphertext copied into another row, or another column, does not open there.
 * Every writer and reader of sealed content names its record through these, and the sealing
 * pass (`parley seal rotate`, src/sealing/reseal.ts) re-seals each kind with the same names.
 */
export const record = {
  messageBody: (messageId: string) => `messages.body:${messageId}`,
  attachmentFilename: (messageId: string, n: number) => `attachments.filename:${messageId}:${n}`,
  attachmentContentType: (messageId: string, n: number) => `attachments.content_type:${messageId}:${n}`,
  attachmentSha256: (messageId: string, n: number) => `attachments.sha256:${messageId}:${n}`,
  /** By upload, not message: a chunk is sealed when it is staged, before its message exists. */
  attachmentChunk: (uploadId: string, seq: number) => `attachment_chunks.data:${uploadId}:${seq}`,
  metadata: (entity: string) => `metadata.data:${entity}`,
  /** An event's copy of a message: every feed's copy of the same event is the same record. */
  eventData: (type: string, messageId: string) => `events.data:${type}:${messageId}`
}

/** Text sealed under the active key, with the key's id for the row's sealed_by. */
export function sealText (plain: string, name: string): { sealed: string, sealedBy: string } {
  const ring = keyring()
  return { sealed: ring.sealText(plain, name), sealedBy: ring.active }
}

/** A text column's value as written: opened when the row was sealed (sealedBy), as it is when not. */
export function openText (stored: string, name: string, sealedBy: string | null): string {
  return sealedBy === null ? stored : keyring().openText(stored, name, sealedBy)
}

/** A JSON value sealed for a jsonb column: a JSON string (base64), with the key's id. */
export function sealJson (value: unknown, name: string): { sealed: string, sealedBy: string } {
  return sealText(JSON.stringify(value), name)
}

/**
 * A jsonb column's value as written: parsed from its sealed string when sealedBy is set. With
 * `shared`, a record many readers open within moments (an event's copy of a message): opened
 * once and kept for the others (Keyring.openTextShared); each still gets its own parse.
 */
export function openJson<T> (stored: unknown, name: string, sealedBy: string | null, shared = false): T {
  if (sealedBy === null) return stored as T
  if (typeof stored !== 'string') throw new Error(`sealed record ${name} is not a sealed string`)
  const ring = keyring()
  return JSON.parse(shared ? ring.openTextShared(stored, name, sealedBy) : ring.openText(stored, name, sealedBy)) as T
}
