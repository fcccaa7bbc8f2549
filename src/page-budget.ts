/**
 * The most one page of a list (search, conversations) may weigh as JSON. An answer is held in
 * memory until its client has read it, so this is what one slow reader's answer can pin; a page
 * that would pass it ends early with a cursor, as at its `limit` (never empty: a single larger
 * item still goes, alone).
 */
export const MAX_PAGE_BYTES = 1024 * 1024

/** A page's running weight: `fits(item)` says whether the item still goes on it, and counts it if so. */
export function pageBudget (maxBytes = MAX_PAGE_BYTES): (item: unknown) => boolean {
  let used = 0
  let items = 0
  return (item) => {
    const size = Buffer.byteLength(JSON.stringify(item))
    if (items > 0 && used + size > maxBytes) return false
    used += size
    items++
    return true
  }
}
