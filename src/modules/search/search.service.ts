import { invalidCursor, isCursorTime } from '../../cursors.js'
import type { Db } from '../../db/client.js'
import type { ReadOptions, Reads } from '../../db/replica.js'
import { TimeLimitExceeded } from '../../db/time-limit.js'
import { Unavailable, ValidationFailed } from '../../errors.js'
import { pageBudget } from '../../page-budget.js'
import { isAddress, isGroupId, isMessageId } from '../../ids.js'
import { entityKind, visibleEntity } from '../entities.js'
import { createGroupsRepository, toGroup } from '../groups/groups.repository.js'
import { withRetention } from '../groups/groups.service.js'
import { createMessagesRepository } from '../messages/messages.repository.js'
import { createUsersRepository, toUser } from '../users/users.repository.js'
import { searchMessages, type Conversation } from './message-search.js'
import { queryTerms } from '../../sealing/search-terms.js'
import { SEARCH_TYPES, type SearchResult, type SearchType } from './search.schemas.js'

export interface SearchInput {
  viewer: string
  query?: string | undefined
  types?: SearchType[] | undefined
  with?: string | undefined
  limit: number
  cursor?: string | undefined
  /** MESSAGE_RETENTION_DAYS, for the groups found (their effectiveRetentionDays). */
  messageRetentionDays?: number | undefined
}

/** The most one search may cost the database: its statements are cancelled past it (503). */
const SEARCH_TIME_LIMIT_MS = 5_000

/** Where a page ends: the result type it stopped in, and the last key it returned there. */
interface Cursor { t: SearchType, k?: string[] }

function encodeCursor (cursor: Cursor): string {
  return Buffer.from(JSON.stringify(cursor)).toString('base64url')
}

/** Whether a cursor's keys are what encodeCursor writes for its type: they reach SQL as values. */
function wellFormedKeys (t: SearchType, k: unknown): boolean {
  if (k === undefined) return true
  if (!Array.isArray(k) || !k.every((part) => typeof part === 'string' && part.length <= 200 && !part.includes('\u0000'))) return false
  const keys = k as string[]
  if (t === 'messages') return keys.length === 2 && isCursorTime(keys[0]!) && isMessageId(keys[1]!)
  if (t === 'users') return keys.length === 1 && isAddress(keys[0]!)
  return keys.length === 2 && keys[0]!.length > 0 && isGroupId(keys[1]!)
}

/** Only what encodeCursor wrote: anything else (forged, truncated, another type's) is a 400, never a 500. */
function decodeCursor (text: string): Cursor {
  try {
    const value = JSON.parse(Buffer.from(text, 'base64url').toString('utf8')) as Cursor
    if (value !== null && typeof value === 'object' && SEARCH_TYPES.includes(value.t) && wellFormedKeys(value.t, value.k)) return value
  } catch { /* answered below */ }
  throw invalidCursor()
}

/**
 * POST /search. Results come in a fixed order, messages (newest first), then users (by
 * address), then groups (by name), and a cursor records where a page stopped, so pages
 * neither overlap nor leave a gap. Served by the read replica when there is one and it has
 * caught up (src/db/replica.ts): the heaviest read there is.
 */
export async function search (reads: Reads, input: SearchInput, options: Pick<ReadOptions, 'arrivedAt'> = {}): Promise<{ results: SearchResult[], nextCursor: string | null }> {
  try {
    return await reads.run((tx) => searchIn(tx, input), { ...options, timeLimitMs: SEARCH_TIME_LIMIT_MS })
  } catch (err) {
    if (err instanceof TimeLimitExceeded) {
      throw new Unavailable(`Search took longer than ${SEARCH_TIME_LIMIT_MS / 1000} s and was stopped; narrow it with longer or more words, or with \`with\``)
    }
    throw err
  }
}

async function searchIn (db: Db, input: SearchInput): Promise<{ results: SearchResult[], nextCursor: string | null }> {
  if (input.query === undefined && input.with === undefined) {
    throw new ValidationFailed('query: required unless with is given')
  }
  let conversation: Conversation | undefined
  if (input.with !== undefined) {
    const entity = await visibleEntity(db, input.with, input.viewer)
    if (entity.kind === 'message' || entityKind(input.with) === 'message') throw new ValidationFailed('with: must be a user address or a group id')
    conversation = entity.kind === 'group' ? { kind: 'group', id: entity.id } : { kind: 'user', address: entity.id }
  }
  // Listing a conversation (no query) means messages only.
  const wanted = input.query === undefined ? ['messages'] as SearchType[] : (input.types ?? [...SEARCH_TYPES])
  const order = SEARCH_TYPES.filter((t) => wanted.includes(t))
  const cursor = input.cursor === undefined ? undefined : decodeCursor(input.cursor)
  const start = cursor === undefined ? 0 : order.indexOf(cursor.t)
  if (start < 0) throw new ValidationFailed('cursor: belongs to a search of other types')

  const results: SearchResult[] = []
  const fits = pageBudget()
  for (let i = start; i < order.length; i++) {
    const type = order[i]!
    const after = i === start ? cursor?.k : undefined
    const room = input.limit - results.length
    const page = await fetchType(db, type, input, conversation, after, room + 1)
    for (const [j, result] of page.results.slice(0, room).entries()) {
      // Past MAX_PAGE_BYTES the page ends early; the next starts at this result.
      if (!fits(result)) return { results, nextCursor: encodeCursor({ t: type, k: j === 0 ? after : page.keys[j - 1] }) }
      results.push(result)
    }
    if (page.results.length > room) {
      return { results, nextCursor: encodeCursor({ t: type, k: page.keys[room - 1] }) }
    }
    // The message search read its bounded candidates without filling the page (message-search.ts
    // SEARCH_ROUNDS_MAX): a short page, and the next goes on past the last candidate it read.
    if (page.resumeAt !== undefined) return { results, nextCursor: encodeCursor({ t: type, k: page.resumeAt }) }
    if (results.length === input.limit) {
      const next = order[i + 1]
      return { results, nextCursor: next === undefined ? null : encodeCursor({ t: next }) }
    }
  }
  return { results, nextCursor: null }
}

async function fetchType (
  db: Db, type: SearchType, input: SearchInput, conversation: Conversation | undefined, after: string[] | undefined, limit: number
): Promise<{ results: SearchResult[], keys: string[][], resumeAt?: string[] }> {
  if (type === 'messages') {
    const terms = input.query === undefined ? undefined : queryTerms(input.query)
    if (input.query !== undefined && terms === undefined) return { results: [], keys: [] }
    const { rows, resumeAfter } = await searchMessages(db, {
      viewer: input.viewer,
      terms,
      with: conversation,
      before: after === undefined ? undefined : { createdAt: after[0]!, id: after[1]! },
      limit
    })
    const views = await createMessagesRepository(db).viewMany(rows, input.viewer)
    return {
      results: views.map((message) => ({ type: 'message', message })),
      keys: rows.map((r) => [r.createdAt.toISOString(), r.id]),
      ...resumeAfter === undefined ? {} : { resumeAt: [resumeAfter.createdAt, resumeAfter.id] }
    }
  }
  if (type === 'users') {
    const rows = await createUsersRepository(db).search(input.query!, after?.[0], limit)
    return { results: rows.map((r) => ({ type: 'user', user: toUser(r) })), keys: rows.map((r) => [r.address]) }
  }
  const groups = createGroupsRepository(db)
  const rows = await groups.searchMine(input.viewer, input.query!, after === undefined ? undefined : { name: after[0]!, id: after[1]! }, limit)
  const results: SearchResult[] = []
  for (const row of rows) results.push({ type: 'group', group: withRetention(toGroup(row, await groups.members(row.id)), input.messageRetentionDays) })
  return { results, keys: rows.map((r) => [r.name, r.id]) }
}
