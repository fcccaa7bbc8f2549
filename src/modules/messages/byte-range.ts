/** A resolved byte range of a file: first and last byte, inclusive. */
export interface ByteRange { start: number, end: number }

/**
 * The one range of a `Range: bytes=…` header (RFC 9110 §14.1.2) over a file of `size` bytes:
 * undefined when the header is absent or not a single bytes range (served whole, as the RFC
 * allows), 'unsatisfiable' when it lies past the end (416).
 */
export function parseRange (header: string | undefined, size: number): ByteRange | 'unsatisfiable' | undefined {
  if (header === undefined) return undefined
  const match = /^bytes=(\d*)-(\d*)$/.exec(header.trim())
  if (match === null) return undefined
  const [, first, last] = match as unknown as [string, string, string]
  if (first === '' && last === '') return undefined
  if (first === '') {
    // A suffix: the last N bytes.
    const n = Number(last)
    if (n === 0 || size === 0) return 'unsatisfiable'
    return { start: Math.max(0, size - n), end: size - 1 }
  }
  const start = Number(first)
  const end = last === '' ? size - 1 : Math.min(Number(last), size - 1)
  if (last !== '' && Number(last) < start) return undefined
  if (start >= size) return 'unsatisfiable'
  return { start, end }
}
