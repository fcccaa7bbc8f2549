/** `%text%` for ILIKE, with LIKE's own wildcards escaped so user text only ever matches itself. */
export function likePattern (text: string): string {
  return `%${text.replace(/[\\%_]/g, (c) => `\\${c}`)}%`
}
