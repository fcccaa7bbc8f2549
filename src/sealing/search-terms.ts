import { keyring } from './keyring.js'

/**
 * What POST /search matches, as terms to hash (API.md §11: the table holds keyed hashes of
 * words, never the words). A word is a run of letters and digits, lower-cased: `alice@example.org`
 * is alice, example and org; `report.pdf` is report and pdf; `3.14` is 3 and 14 (a query is split
 * the same way, so each still finds itself). Every query word must be a prefix of a word of the
 * body ('hel' finds "Hello"), from 2 characters (a one-character word finds that word alone).
 * A body's terms are each of its words' prefixes from 2 to PREFIX_MAX characters, and each word
 * whole up to PREFIX_MAX; a query word longer than that is looked up by its first PREFIX_MAX,
 * and the search keeps the candidates whose opened body holds the whole query (holdsQuery).
 * 12 keeps a long token's share of the row and the index small (a 32-character hash or id: 11
 * terms, not 32).
 */
const PREFIX_MAX = 12

/** At most this many words of a query count (as before: a query is at most 200 characters). */
const QUERY_WORDS_MAX = 32

const SURROGATE = /[\uD800-\uDFFF]/

function words (text: string): string[] {
  return [...new Set(text.toLowerCase().match(/[\p{L}\p{N}]+/gu) ?? [])]
}

/**
 * A body's terms: every prefix of every word from 2 to PREFIX_MAX characters, and the word whole
 * if it is no longer (a longer word is looked up by its first PREFIX_MAX: hashing it whole
 * would add a term no query asks for).
 */
function bodyTerms (body: string): Set<string> {
  const terms = new Set<string>()
  for (const word of words(body)) {
    // By characters, not UTF-16 units: split into code points only when a word has a pair.
    const chars: ArrayLike<string> = SURROGATE.test(word) ? Array.from(word) : word
    if (chars.length <= PREFIX_MAX) terms.add(word)
    let prefix = chars[0]!
    for (let n = 1; n < chars.length - 1 && n < PREFIX_MAX; n++) {
      prefix += chars[n]
      terms.add(prefix)
    }
  }
  return terms
}

/** A query's words (at most QUERY_WORDS_MAX), each of which a matching body must hold as a word prefix; undefined when it has none. */
export function queryTerms (query: string): string[] | undefined {
  const found = words(query).slice(0, QUERY_WORDS_MAX)
  return found.length === 0 ? undefined : found
}

/** Whether `body` holds every query word (queryTerms) as a word prefix, a one-character word as a word. */
export function holdsQuery (body: string, query: string[]): boolean {
  const held = words(body)
  return query.every((q) => [...q].length === 1 ? held.includes(q) : held.some((w) => w.startsWith(q)))
}

/** The term a query word is looked up by: itself, or its first PREFIX_MAX characters. */
function lookupTerm (word: string): string {
  const chars = Array.from(word)
  return chars.length > PREFIX_MAX ? chars.slice(0, PREFIX_MAX).join('') : word
}

/** A body's search hashes under the active key, as PostgreSQL's array text for search_hashes. */
export function bodySearchHashes (body: string): string {
  return `{${keyring().searchHashes(bodyTerms(body)).join(',')}}`
}

/**
 * A query's hashes under every configured key, one array text each: rows sealed under a key
 * rotation has not reached yet still match theirs.
 */
export function querySearchHashes (query: string[]): string[] {
  const ring = keyring()
  const terms = [...new Set(query.map(lookupTerm))]
  return ring.ids.map((id) => `{${ring.searchHashes(terms, id).join(',')}}`)
}
