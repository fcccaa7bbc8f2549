import { randomFillSync } from 'node:crypto'

// Crockford's base32, lower-case: URL-safe, no look-alike letters, sorts like the number it encodes.
const ALPHABET = '0123456789abcdefghjkmnpqrstvwxyz'

function base32 (bytes: Uint8Array): string {
  let out = ''
  let bits = 0
  let value = 0
  for (const byte of bytes) {
    value = (value << 8) | byte
    bits += 8
    while (bits >= 5) {
      out += ALPHABET[(value >>> (bits - 5)) & 31]
      bits -= 5
    }
  }
  if (bits > 0) out += ALPHABET[(value << (5 - bits)) & 31]
  return out
}

// Random bytes drawn from the CSPRNG 4 KiB at a time, each used once: one call per 409 ids
// instead of one per id (it showed in the send's profile).
const entropy = Buffer.alloc(4096)
let entropyUsed = entropy.length

/**
 * A new id such as `msg_01jh…`: 48 bits of milliseconds then 80 random bits (a ULID's layout),
 * so ids are unguessable yet roughly time-ordered.
 */
export function newId (prefix: string, now = Date.now()): string {
  const bytes = Buffer.alloc(16)
  bytes.writeUIntBE(now, 0, 6)
  if (entropyUsed + 10 > entropy.length) {
    randomFillSync(entropy)
    entropyUsed = 0
  }
  entropy.copy(bytes, 6, entropyUsed, entropyUsed + 10)
  entropyUsed += 10
  return `${prefix}_${base32(bytes)}`
}

/**
 * The least id newId could give at `ms` (its random bits all zero): every id made at or after
 * that millisecond sorts at or above it.
 */
export function idFloor (prefix: string, ms: number): string {
  const bytes = Buffer.alloc(16)
  bytes.writeUIntBE(Math.max(0, Math.floor(ms)), 0, 6)
  return `${prefix}_${base32(bytes)}`
}

/** A user's address: 1–64 of [a-z0-9.@+-], starting with a letter or digit (API.md §1). */
export const ADDRESS_PATTERN = '^[a-z0-9][a-z0-9.@+-]{0,63}$'
export const GROUP_ID_PATTERN = '^grp_[0-9a-z]{26}$'
export const MESSAGE_ID_PATTERN = '^msg_[0-9a-z]{26}$'

const ADDRESS = new RegExp(ADDRESS_PATTERN)
const GROUP_ID = new RegExp(GROUP_ID_PATTERN)
const MESSAGE_ID = new RegExp(MESSAGE_ID_PATTERN)

/** An address as it is stored and compared: lower-case (API.md §1, case-insensitive). */
export const normalizeAddress = (address: string): string => address.toLowerCase()
/** Addresses compare case-insensitively: pass the normalized form. */
export const isAddress = (text: string): boolean => ADDRESS.test(text)
export const isGroupId = (text: string): boolean => GROUP_ID.test(text)
export const isMessageId = (text: string): boolean => MESSAGE_ID.test(text)
