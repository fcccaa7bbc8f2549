import { record, openText, sealText } from '../../sealing/records.js'
import { bodySearchHashes } from '../../sealing/search-terms.js'

/**
 * A body as the messages table keeps it (API.md §11): sealed under the active key, and the
 * keyed hashes of its words and prefixes that search matches, never the words.
 */
export interface StoredBody {
  body: string
  sealedBy: string
  searchHashes: string
}

export function storedBody (messageId: string, body: string): StoredBody {
  const { sealed, sealedBy } = sealText(body, record.messageBody(messageId))
  return { body: sealed, sealedBy, searchHashes: bodySearchHashes(body) }
}

/** The body a stored row holds: opened under its key (SealedKeyMissing, a 503, if that key is gone), or as it is when plain. */
export function openedBody (row: { id: string, body: string, sealedBy: string | null }): string {
  return openText(row.body, record.messageBody(row.id), row.sealedBy)
}
