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

/** A row of a binary COPY: each field's bytes, null for NULL. */
export type CopiedRow = (Buffer | null)[]

/** The 11-byte signature, then flags (int32) and the header extension's length (int32). */
const SIGNATURE = Buffer.from('PGCOPY\n\xff\r\n\0', 'latin1')
const HEADER_BYTES = SIGNATURE.length + 8

interface CopyDataMessage { chunk: Buffer }

/**
 * Reads a binary COPY's stream (its signature and header, then rows, then the trailer) as it
 * comes, a piece at a time: a node-postgres CopyData message, or PGlite's whole Blob. A row
 * never spans two pieces (PostgreSQL sends one row per CopyData). Each field is copied out:
 * a CopyData message is a view of the driver's read buffer, which it reuses for the next read.
 */
class CopyReader {
  readonly rows: CopiedRow[] = []
  #headerRead = false

  read (data: Buffer): void {
    let at = 0
    if (!this.#headerRead) {
      if (data.length < HEADER_BYTES || !data.subarray(0, SIGNATURE.length).equals(SIGNATURE)) throw new Error('COPY answered without the binary format\'s signature')
      at = HEADER_BYTES + data.readUInt32BE(HEADER_BYTES - 4)
      this.#headerRead = true
    }
    while (at < data.length) {
      const fields = data.readInt16BE(at)
      at += 2
      if (fields === -1) return
      const row: CopiedRow = []
      for (let i = 0; i < fields; i++) {
        const length = data.readInt32BE(at)
        at += 4
        if (length === -1) {
          row.push(null)
          continue
        }
        if (at + length > data.length) throw new Error('a binary COPY row longer than its message')
        const field = Buffer.allocUnsafe(length)
        data.copy(field, 0, at, at + length)
        row.push(field)
        at += length
      }
      this.rows.push(row)
    }
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
    this.callback?.(this.#failed ?? null, this.#reader.rows)
  }

  // Not sent for COPY TO; here so an unexpected message fails the statement, not the process.
  handleRowDescription (): void {}
  handleDataRow (): void {}
  handleEmptyQuery (): void {}
  handleCopyInResponse (): void {}
  handlePortalSuspended (): void {}
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
  // PGlite, or one of its transactions.
  const { blob } = await (client as Pick<PGliteInterface, 'query'>).query(copy("'/dev/blob'"))
  const reader = new CopyReader()
  if (blob !== undefined) reader.read(Buffer.from(await blob.arrayBuffer()))
  return reader.rows
}
