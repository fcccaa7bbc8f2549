/**
 * Bytes held as a list of pieces (a chunk read in slices, opened slice by slice), so no buffer
 * of the whole is ever made: ranges are subarrays of the pieces.
 */

/** Bytes `from`..`to` (exclusive) of `pieces`, as subarrays of them. */
export function piecesBetween (pieces: Buffer[], from: number, to: number): Buffer[] {
  const parts: Buffer[] = []
  let at = 0
  for (const piece of pieces) {
    const start = Math.max(from, at)
    const end = Math.min(to, at + piece.length)
    if (start < end) parts.push(piece.subarray(start - at, end - at))
    at += piece.length
  }
  return parts
}

/** How many bytes `pieces` hold. */
export function piecesLength (pieces: Buffer[]): number {
  return pieces.reduce((sum, piece) => sum + piece.length, 0)
}
