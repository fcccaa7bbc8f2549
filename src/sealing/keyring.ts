import { createCipheriv, createDecipheriv, createHmac, createSecretKey, hash, hkdfSync, randomBytes, type KeyObject } from 'node:crypto'
import { AppError } from '../errors.js'
import { piecesBetween, piecesLength } from './pieces.js'

/**
 * Content sealed at rest (API.md §11). Every record that holds what a message says (a body, a
 * file's chunk, its name and type, metadata, an event's copy of a message) is sealed in Node
 * with AES-256-GCM before it is written and opened after it is read, so PostgreSQL, its dumps,
 * backups and replicas hold only ciphertext. Each record has its own random 96-bit nonce, and
 * the record's identity (table, column, row key) as associated data, so a ciphertext copied
 * into another row fails to open. The row keeps the id of the key it was sealed under in its
 * `sealed_by` column (NULL: written before sealing, still plain; the sealing pass seals it).
 *
 * A configured key is only a master: what seals, what hashes search words and what tags
 * (ETags, idempotency request hashes) are three keys derived from it with HKDF, so no two uses
 * ever share a key. Keys are not wrapped data keys: rotation re-seals each record once anyway
 * (search hashes must be recomputed from the words), so wrapping would save nothing here.
 */

/** A master key as configured: `id:hex64` in SEALING_KEYS. */
export interface SealingKey {
  id: string
  secret: Buffer
}

const NONCE_BYTES = 12
const TAG_BYTES = 16

/**
 * A GCM nonce must never repeat under one key. Each is 8 random bytes drawn for this process
 * (and drawn again after 2^32 seals) then a 32-bit counter (NIST SP 800-38D §8.2.1's
 * deterministic construction): two processes share nonces only if their 64-bit draws collide,
 * less likely than 96 random bits per record over 2^32 records, and a seal costs no draw from
 * the system's generator (6 µs each, measured; a third of what a seal cost).
 */
let noncePrefix = randomBytes(8)
let nonceCounter = 0

function nextNonce (): Buffer {
  if (nonceCounter === 0x1_0000_0000) {
    noncePrefix = randomBytes(8)
    nonceCounter = 0
  }
  const nonce = Buffer.allocUnsafe(NONCE_BYTES)
  noncePrefix.copy(nonce, 0)
  nonce.writeUInt32BE(nonceCounter++, 8)
  return nonce
}

/** A record sealed under a key this instance no longer has: 503 naming the key, nothing lost. */
class SealedKeyMissing extends AppError {
  readonly keyId: string
  constructor (keyId: string) {
    super(503, 'SEALED_KEY_MISSING', `this data is sealed under key ${JSON.stringify(keyId)}, which SEALING_KEYS no longer holds; add it back (after the key that seals new data) to read it`)
    this.keyId = keyId
  }
}

/** A record that does not open under its own key: changed in the database, or moved from another row. */
export class SealBroken extends Error {
  override name = 'SealBroken'
  readonly keyId: string
  readonly record: string
  constructor (keyId: string, record: string) {
    super(`sealed record ${record} does not open under key ${JSON.stringify(keyId)}: it was changed, or moved from another row`)
    this.keyId = keyId
    this.record = record
  }
}

interface Derived {
  /**
   * A KeyObject, made once: given a Buffer, each cipher imports the key anew, 5 µs a record on
   * Node 20 and 25-30 µs on Node 24 (the image's runtime), against 5 µs with a KeyObject.
   */
  seal: KeyObject
  /** The search key as hex: prefixed to each term (searchHashes). */
  search: string
  tag: KeyObject
}

function derive (secret: Buffer): Derived {
  const sub = (info: string) => Buffer.from(hkdfSync('sha256', secret, Buffer.alloc(0), `parley ${info}`, 32))
  return { seal: createSecretKey(sub('seal v1')), search: sub('search v1').toString('hex'), tag: createSecretKey(sub('tag v1')) }
}

/** openTextShared's memory: the opened records it keeps, at most, in characters (UTF-16 units) of ciphertext and plaintext. */
const SHARED_CHARS_MAX = 4 * 1024 * 1024
/** A record larger than this is opened each time, not kept. */
const SHARED_RECORD_CHARS_MAX = 64 * 1024
/** A kept record not read for this long is dropped at the next miss: a fan-out's readers come within moments. */
const SHARED_IDLE_MS = 60_000

interface SharedOpen { record: string, keyId: string, plain: string, readAt: number }

export class Keyring {
  /** The id of the key that seals new records: the first configured. */
  readonly active: string
  readonly ids: readonly string[]
  readonly #keys: Map<string, Derived>
  /** openTextShared's records by ciphertext, least recently read first. */
  readonly #shared = new Map<string, SharedOpen>()
  #sharedChars = 0
  /** openTextShared's clock (ms): a test moves it past SHARED_IDLE_MS. */
  readonly #now: () => number

  constructor (keys: SealingKey[], now: () => number = () => performance.now()) {
    this.#now = now
    if (keys.length === 0) throw new Error('a keyring needs at least one key')
    this.active = keys[0]!.id
    this.ids = keys.map((k) => k.id)
    this.#keys = new Map(keys.map((k) => [k.id, derive(k.secret)]))
  }

  has (keyId: string): boolean {
    return this.#keys.has(keyId)
  }

  #derived (keyId: string): Derived {
    const derived = this.#keys.get(keyId)
    if (derived === undefined) throw new SealedKeyMissing(keyId)
    return derived
  }

  /** `plain` sealed under the active key, bound to `record`: nonce, ciphertext, tag. */
  seal (plain: Buffer | string, record: string): Buffer {
    const nonce = nextNonce()
    const cipher = createCipheriv('aes-256-gcm', this.#derived(this.active).seal, nonce).setAAD(Buffer.from(record))
    const body = typeof plain === 'string' ? cipher.update(plain, 'utf8') : cipher.update(plain)
    return Buffer.concat([nonce, body, cipher.final(), cipher.getAuthTag()])
  }

  /** What `seal` sealed under `keyId` for `record`; SealedKeyMissing, or SealBroken if it does not open. */
  open (sealed: Buffer, record: string, keyId: string): Buffer {
    const key = this.#derived(keyId).seal
    if (sealed.length < NONCE_BYTES + TAG_BYTES) throw new SealBroken(keyId, record)
    try {
      const decipher = createDecipheriv('aes-256-gcm', key, sealed.subarray(0, NONCE_BYTES)).setAAD(Buffer.from(record))
      decipher.setAuthTag(sealed.subarray(sealed.length - TAG_BYTES))
      return Buffer.concat([decipher.update(sealed.subarray(NONCE_BYTES, sealed.length - TAG_BYTES)), decipher.final()])
    } catch {
      throw new SealBroken(keyId, record)
    }
  }

  /**
   * `open` for a record read in pieces (a file's chunk, as db/copy-out.ts hands it over): the
   * plaintext in pieces of about the same sizes, none of it returned unless the whole record
   * authenticates.
   * No buffer of the record's whole size is made: a 256 KiB one per chunk, freed at once, grew
   * an exporting server's memory by 100 MiB over 1 GiB (the allocator keeps such blocks).
   */
  openPieces (pieces: Buffer[], record: string, keyId: string): Buffer[] {
    const key = this.#derived(keyId).seal
    const total = piecesLength(pieces)
    if (total < NONCE_BYTES + TAG_BYTES) throw new SealBroken(keyId, record)
    const range = (from: number, to: number) => piecesBetween(pieces, from, to)
    try {
      const decipher = createDecipheriv('aes-256-gcm', key, Buffer.concat(range(0, NONCE_BYTES))).setAAD(Buffer.from(record))
      decipher.setAuthTag(Buffer.concat(range(total - TAG_BYTES, total)))
      const plain = range(NONCE_BYTES, total - TAG_BYTES).map((part) => decipher.update(part))
      decipher.final()
      return plain.filter((part) => part.length > 0)
    } catch {
      throw new SealBroken(keyId, record)
    }
  }

  /** Text sealed for a text column: base64. */
  sealText (plain: string, record: string): string {
    return this.seal(plain, record).toString('base64')
  }

  openText (sealed: string, record: string, keyId: string): string {
    return this.open(Buffer.from(sealed, 'base64'), record, keyId).toString('utf8')
  }

  /**
   * openText for a record that many readers open within moments: an event's copy of a message,
   * which is one ciphertext in every recipient's feed (a group of 1,000) and is read by each of
   * their connections. The last few MiB of such records are kept opened, by their ciphertext:
   * a hit is the same bytes that authenticated before, under the same record name and key, so
   * it answers what opening them again would. A fan-out to 5,000 connections opened one
   * ciphertext 5,000 times (3 % of the server's busy time). What it keeps is what the process
   * held anyway while it answered; the threat model leaves the app host out (docs/security.md).
   */
  openTextShared (sealed: string, record: string, keyId: string): string {
    const now = this.#now()
    const hit = this.#shared.get(sealed)
    if (hit !== undefined) this.#forget(sealed, hit)
    if (hit !== undefined && hit.record === record && hit.keyId === keyId) {
      this.#keep(sealed, { ...hit, readAt: now })
      return hit.plain
    }
    const plain = this.openText(sealed, record, keyId)
    if (sealed.length + plain.length <= SHARED_RECORD_CHARS_MAX) this.#keep(sealed, { record, keyId, plain, readAt: now })
    // Least recently read first: over the bound, or idle for SHARED_IDLE_MS, they go.
    for (const [oldest, entry] of this.#shared) {
      if (this.#sharedChars <= SHARED_CHARS_MAX && now - entry.readAt < SHARED_IDLE_MS) break
      this.#forget(oldest, entry)
    }
    return plain
  }

  #keep (sealed: string, entry: SharedOpen): void {
    this.#shared.set(sealed, entry)
    this.#sharedChars += sealed.length + entry.plain.length
  }

  #forget (sealed: string, entry: SharedOpen): void {
    this.#shared.delete(sealed)
    this.#sharedChars -= sealed.length + entry.plain.length
  }

  /** What openTextShared keeps now: records, and their characters. */
  get sharedOpens (): { records: number, chars: number } {
    return { records: this.#shared.size, chars: this.#sharedChars }
  }

  /**
   * A keyed tag of `data` under `keyId`'s tag key (the active key by default), hex: an ETag or
   * an idempotency request hash that confirms no guess to whoever reads the database.
   */
  tag (data: string | Buffer, keyId = this.active): string {
    return createHmac('sha256', this.#derived(keyId).tag).update(data).digest('hex')
  }

  /**
   * Each term's keyed hash under `keyId`'s search key, as the decimal of a signed 32-bit
   * integer: the first 32 bits of SHA-256 over the 256-bit key and the term. A secret-prefix
   * hash is a PRF once truncated (length extension needs the whole digest, and 224 of its bits
   * are never stored), and it costs a sixth of an HMAC (0.55 against 3.3 µs a term, measured):
   * a body holds 10-60 terms (every word and its prefixes), hashed on every send. 32 bits keep
   * the row and the index small (64 cost search twice the time on 300,000 messages: every
   * matching row is read); a term that collides only adds a candidate, which the search drops
   * once it has opened the body (message-search.ts).
   */
  searchHashes (terms: Iterable<string>, keyId = this.active): string[] {
    const key = this.#derived(keyId).search
    const hashes: string[] = []
    for (const term of terms) {
      // The digest as latin1 ('binary'), one character a byte: its first four read as a big-endian int32
      // without the hex string and its parse (the same value; 0.38 -> 0.31 µs a term).
      const d = hash('sha256', key + term, 'binary')
      hashes.push(String((d.charCodeAt(0) << 24) | (d.charCodeAt(1) << 16) | (d.charCodeAt(2) << 8) | d.charCodeAt(3)))
    }
    return hashes
  }
}

let installed: Keyring | undefined

/**
 * The process's keyring. One per process, as the configuration is: installed by the server, the
 * CLI or a test before anything reads or writes content; every repository seals and opens
 * through it.
 */
export function keyring (): Keyring {
  if (installed === undefined) throw new Error('no sealing keyring is installed (SEALING_KEYS)')
  return installed
}

export function installKeyring (ring: Keyring): void {
  installed = ring
}

/** Parses SEALING_KEYS: `id:hex64[,id:hex64…]`, ids unique. Throws naming what is wrong. */
export function parseSealingKeys (text: string): SealingKey[] {
  const keys: SealingKey[] = []
  for (const part of text.split(',').map((p) => p.trim()).filter((p) => p !== '')) {
    const match = /^([A-Za-z0-9_-]{1,32}):([0-9a-fA-F]{64})$/.exec(part)
    if (match === null) throw new Error('each key must be id:hex64 (an id of 1-32 letters, digits, _ or -, then 64 hexadecimal digits)')
    if (keys.some((k) => k.id === match[1])) throw new Error(`key id ${match[1]} is given twice`)
    keys.push({ id: match[1]!, secret: Buffer.from(match[2]!, 'hex') })
  }
  if (keys.length === 0) throw new Error('at least one key is needed')
  return keys
}

/** A new random key, as SEALING_KEYS writes it. */
export function newSealingKey (id: string): string {
  return `${id}:${randomBytes(32).toString('hex')}`
}
