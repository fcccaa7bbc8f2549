import type { PGliteInterface } from '@electric-sql/pglite'
import { sql, type SQL } from 'drizzle-orm'
import { PgDialect } from 'drizzle-orm/pg-core'
import pg from 'pg'
import type { Db } from './client.js'

/**
 * Reading bytea without hex. Both drivers answer every value as text, a bytea as hex twice its
 * size, made into a string and parsed back (node-postgres's binary mode decodes values as
 * UTF-8, which changes bytes). A binary COPY of a SELECT answers the rows as they are stored,
 * each field length-prefixed, the bytes as bytes: node-postgres gets them as CopyData messages
 * (`TO STDOUT`, one message a row), PGlite as a Blob (`TO '/dev/blob'`). A chunk of 256 KiB is
 * one statement so, not five slices of hex (each statement cost Node about half a millisecond
 * of `writev` on a loopback socket: 2026-11-28, an export's profile; on PGlite 2 ms against
 * 20), and no string a driver makes is large.
 */

/** A row of a binary COPY: each field's bytes in pieces (see PIECE_BYTES), null for NULL. */
export type CopiedRow = (Buffer[] | null)[]

/**
 * Fields are copied out in pieces of at most this many bytes: a buffer of a chunk's whole
 * size (256 KiB) per read, freed at once, grew an exporting server by 100 MiB over 1 GiB (the
 * allocator keeps such blocks; keyring.ts, openPieces, which takes the pieces as they are).
 */
const PIECE_BYTES = 64 * 1024

/** The 11-byte signature, then flags (int32) and the header extension's length (int32). */
const SIGNATURE = Buffer.from('PGCOPY\n\xff\r\n\0', 'latin1')
const HEADER_BYTES = SIGNATURE.length + 8

interface CopyDataMessage { chunk: Buffer }

/** `length` bytes of `data` from `at`, copied, in pieces of at most PIECE_BYTES. */
function copiedPieces (data: Buffer, at: number, length: number): Buffer[] {
  const pieces: Buffer[] = []
  for (let from = at, end = at + length; from < end || pieces.length === 0; from += PIECE_BYTES) {
    const piece = Buffer.allocUnsafe(Math.min(PIECE_BYTES, end - from))
    data.copy(piece, 0, from, from + piece.length)
    pieces.push(piece)
  }
  return pieces
}

/**
 * Reads a binary COPY's stream (its signature and header, then rows, then the trailer) as it
 * comes, a piece at a time: a node-postgres CopyData message, or PGlite's whole Blob. A row
 * never spans two pieces (PostgreSQL sends one row per CopyData: the header with the first,
 * the trailer on its own). Each field is copied out: a CopyData message is a view of the
 * driver's read buffer, which it reuses for the next read. A stream without its trailer, or
 * with bytes after it, is an error, never fewer rows.
 */
class CopyReader {
  readonly #rows: CopiedRow[] = []
  readonly #restarts: boolean
  #headerRead = false
  #ended = false

  /**
   * `restarts`: a signature where a row would start begins the stream anew (a row of 20,551
   * fields, which its first two bytes would say, cannot be: PostgreSQL's limit is 1,664).
   * PGlite keeps what a COPY that failed had written to /dev/blob, and hands it over in front of
   * the next statement's own answer.
   */
  constructor (restarts = false) {
    this.#restarts = restarts
  }

  #header (data: Buffer, at: number): number {
    if (data.length - at < HEADER_BYTES || !data.subarray(at, at + SIGNATURE.length).equals(SIGNATURE)) throw new Error('COPY answered without the binary format\'s signature')
    this.#headerRead = true
    return at + HEADER_BYTES + data.readUInt32BE(at + HEADER_BYTES - 4)
  }

  read (data: Buffer): void {
    let at = this.#headerRead ? 0 : this.#header(data, 0)
    while (at < data.length) {
      if (this.#restarts && !this.#ended && data.subarray(at, at + SIGNATURE.length).equals(SIGNATURE)) {
        this.#rows.length = 0
        at = this.#header(data, at)
        continue
      }
      if (this.#ended) throw new Error('a binary COPY answered bytes after its trailer')
      const fields = data.readInt16BE(at)
      at += 2
      if (fields === -1) {
        this.#ended = true
        continue
      }
      const row: CopiedRow = []
      for (let i = 0; i < fields; i++) {
        const length = data.readInt32BE(at)
        at += 4
        if (length === -1) {
          row.push(null)
          continue
        }
        if (at + length > data.length) throw new Error('a binary COPY row longer than its message')
        row.push(copiedPieces(data, at, length))
        at += length
      }
      this.#rows.push(row)
    }
  }

  /** The rows, once the trailer was read. */
  rows (): CopiedRow[] {
    if (!this.#ended) throw new Error('a binary COPY ended without its trailer')
    return this.#rows
  }
}

/**
 * The Submittable node-postgres runs (the interface pg-cursor and pg-query-stream use): the
 * statement goes out as a simple query, and the client hands over the answer's messages.
 */
class BinaryCopy {
  /** Set by the client (query's callback argument), or by a pool, its wrapper of it. */
  callback?: (err: Error | null, rows?: CopiedRow[]) => void
  readonly #text: string
  readonly #reader = new CopyReader()
  #failed: Error | undefined

  constructor (text: string) {
    this.#text = text
  }

  submit (connection: { query (text: string): void }): void {
    connection.query(this.#text)
  }

  handleCopyData (message: CopyDataMessage): void {
    if (this.#failed !== undefined) return
    try {
      this.#reader.read(message.chunk)
    } catch (err) {
      this.#failed = err as Error
    }
  }

  handleCommandComplete (): void {}

  handleError (err: Error): void {
    this.callback?.(err)
  }

  handleReadyForQuery (): void {
    if (this.#failed !== undefined) {
      this.callback?.(this.#failed)
      return
    }
    let rows: CopiedRow[]
    try {
      rows = this.#reader.rows()
    } catch (err) {
      this.callback?.(err as Error)
      return
    }
    this.callback?.(null, rows)
  }

  // Never sent for a COPY TO: whatever comes instead fails the statement (at ReadyForQuery),
  // rather than answer fewer rows.
  #unexpected (what: string): void {
    this.#failed ??= new Error(`a binary COPY was answered ${what}`)
  }

  handleRowDescription (): void { this.#unexpected('a row description') }
  handleDataRow (): void { this.#unexpected('rows') }
  handleEmptyQuery (): void { this.#unexpected('as an empty query') }
  handlePortalSuspended (): void { this.#unexpected('a suspended portal') }
  /** A COPY FROM, which would wait for input forever: refused, as pg's own queries do. */
  handleCopyInResponse (connection: { sendCopyFail (message: string): void }): void {
    this.#unexpected('as a COPY FROM')
    connection.sendCopyFail('a COPY TO was expected')
  }
}

const dialect = new PgDialect()

/** `value` as a quoted SQL literal, for a COPY statement (which takes no parameters). */
export function literal (value: string): SQL {
  return sql.raw(pg.escapeLiteral(value))
}

/**
 * The rows of `select` (which must carry its values as literals: COPY takes no parameters),
 * each field's stored bytes, on either driver, through `db`: the pool, a transaction's
 * connection, or the embedded database.
 */
export async function copyOutBinary (db: Db, select: SQL): Promise<CopiedRow[]> {
  const client = (db._.session as unknown as { client: unknown }).client
  const copy = (target: string) => {
    const query = dialect.sqlToQuery(sql`COPY (${select}) TO ${sql.raw(target)} (FORMAT binary)`)
    if (query.params.length > 0) throw new Error('a COPY statement takes its values as literals')
    return query.sql
  }
  if (client instanceof pg.Pool || client instanceof pg.Client) {
    const text = copy('STDOUT')
    return new Promise((resolve, reject) => {
      // Typed for text and configs; any object with submit() is run as it is (pg's Submittable).
      // The callback goes as an argument, not on the object: a pool wraps it to give its
      // connection back first, which it does only when the object has none of its own.
      const run = client as unknown as { query (q: BinaryCopy, callback: (err: Error | null | undefined, rows?: CopiedRow[]) => void): void }
      run.query(new BinaryCopy(text), (err, rows) => { if (err !== null && err !== undefined) reject(err); else resolve(rows ?? []) })
    })
  }
  // PGlite, or one of its transactions: a COPY to /dev/blob always answers one (at least the
  // header and trailer).
  const { blob } = await (client as Pick<PGliteInterface, 'query'>).query(copy("'/dev/blob'"))
  if (blob === undefined) throw new Error('a binary COPY to /dev/blob answered no blob')
  const reader = new CopyReader(true)
  reader.read(Buffer.from(await blob.arrayBuffer()))
  return reader.rows()
}
