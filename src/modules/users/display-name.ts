import { ValidationFailed } from '../../errors.js'

/** The longest display name, in UTF-16 code units (as the schemas' maxLength counts). */
const MAX_DISPLAY_NAME = 100

/**
 * What no display name may hold: controls (Cc); format characters (Cf), which are invisible and
 * include every bidirectional embedding, override, isolate and mark (U+202A-202E, U+2066-2069,
 * U+200E/200F, U+061C), zero-width spaces and joiners, the BOM, word joiner and invisible
 * operators, soft hyphen and tag characters; line and paragraph separators; and the Hangul
 * fillers that render as nothing. A name shown to others must read as it is stored: "alice" in
 * a name that renders as "ecila", or a name that looks like another's, is an impersonation.
 */
const INVISIBLE = /[\p{Cc}\p{Cf}\p{Zl}\p{Zp}\u115F\u1160\u3164\uFFA0]/u
/** A zero-width joiner between two emoji (👩‍💻) is how those sequences are written: allowed there only. */
const EMOJI_JOINER = /(?<=\p{Extended_Pictographic}(?:\uFE0F|\p{Emoji_Modifier})?)\u200D(?=\p{Extended_Pictographic})/gu

/** What is wrong with a display name, if anything (for the caller to name its field). */
export function displayNameProblem (name: string): string | undefined {
  if (name.length === 0) return 'must not be empty'
  if (name.length > MAX_DISPLAY_NAME) return `at most ${MAX_DISPLAY_NAME} characters`
  const bad = INVISIBLE.exec(name.replace(EMOJI_JOINER, ''))
  if (bad !== null) {
    const code = bad[0].codePointAt(0)!.toString(16).toUpperCase().padStart(4, '0')
    return `must not contain invisible, control or bidirectional formatting characters (found U+${code})`
  }
  return undefined
}

/** Refuses a display name with a 400 naming `field` (displayName on the API; the CLI names its option). */
export function checkDisplayName (name: string | null | undefined, field = 'displayName'): void {
  if (name === null || name === undefined) return
  const problem = displayNameProblem(name)
  if (problem !== undefined) throw new ValidationFailed(`${field}: ${problem}`)
}
