import { createHash, randomBytes } from 'node:crypto'
import { sql } from 'drizzle-orm'
import type { Db } from '../../src/db/client.js'
import { queryRows } from '../../src/db/rows.js'
import { keyring } from '../../src/sealing/keyring.js'
import { openJson, openText, record } from '../../src/sealing/records.js'

/**
 * Content written straight into the tables, as a database from before sealing holds it (every
 * sealed_by NULL), and read back through the records' own names whatever it is sealed under:
 * the sealing pass's tests compare the two.
 */
export interface Content {
  bodies: Map<string, string>
  files: Map<string, { filename: string, contentType: string, sha256: string, bytes: Buffer, uploadId: string }>
  metadata: Map<string, unknown>
  events: Map<string, unknown>
}

const CHUNK = 256 * 1024

export async function writePlainContent (db: Db, prefix: string, messages = 5): Promise<Content> {
  const content: Content = { bodies: new Map(), files: new Map(), metadata: new Map(), events: new Map() }
  for (const address of [`${prefix}a`, `${prefix}b`]) {
    await queryRows(db, sql`INSERT INTO users (address) VALUES (${address}) ON CONFLICT DO NOTHING`)
  }
  for (let i = 0; i < messages; i++) {
    const id = `msg_${prefix}${String(i).padStart(4, '0')}`
    const body = `Hello ${prefix} number ${i}: ünïcødé ✓ ${randomBytes(4).toString('hex')}`
    await queryRows(db, sql`INSERT INTO messages (id, sender, recipient, body) VALUES (${id}, ${`${prefix}a`}, ${`${prefix}b`}, ${body})`)
    content.bodies.set(id, body)
    const data = { message: { id, from: `${prefix}a`, to: `${prefix}b`, body, createdAt: new Date().toISOString() } }
    await queryRows(db, sql`INSERT INTO events (address, seq, type, data, message_id) VALUES (${`${prefix}b`}, ${i + 1}, 'message.received', ${JSON.stringify(data)}::jsonb, ${id})`)
    content.events.set(`${prefix}b/${i + 1}`, data)
    const meta = { label: `m${i}`, nested: { n: i } }
    await queryRows(db, sql`INSERT INTO metadata (entity, data) VALUES (${id}, ${JSON.stringify(meta)}::jsonb)`)
    content.metadata.set(id, meta)
    if (i < 2) {
      // The first file spans two chunks (one whole, one short), the second is small.
      const bytes = randomBytes(i === 0 ? CHUNK + 1000 : 3000)
      const uploadId = `upl_${prefix}${i}`
      const sha256 = createHash('sha256').update(bytes).digest('hex')
      await queryRows(db, sql`INSERT INTO attachments (message_id, n, filename, content_type, size, sha256, upload_id)
        VALUES (${id}, 1, ${`file ${i}.bin`}, 'application/octet-stream', ${bytes.length}, ${sha256}, ${uploadId})`)
      for (let seq = 0; seq * CHUNK < bytes.length; seq++) {
        await queryRows(db, sql`INSERT INTO attachment_chunks (upload_id, seq, message_id, data) VALUES (${uploadId}, ${seq}, ${id}, ${bytes.subarray(seq * CHUNK, (seq + 1) * CHUNK)}::bytea)`)
      }
      content.files.set(`${id}/1`, { filename: `file ${i}.bin`, contentType: 'application/octet-stream', sha256, bytes, uploadId })
    }
  }
  // A typing event: not a copy of a message, never sealed.
  await queryRows(db, sql`INSERT INTO events (address, seq, type, data) VALUES (${`${prefix}b`}, 10000, 'typing', '{"from":"x"}'::jsonb)`)
  return content
}

function toBuffer (data: Buffer | Uint8Array | string): Buffer {
  if (Buffer.isBuffer(data)) return data
  if (typeof data === 'string') return Buffer.from(data.slice(2), 'hex')
  return Buffer.from(data.buffer, data.byteOffset, data.byteLength)
}

/** What the tables hold for `content`'s records, opened; the key ids they are under. */
export async function readContent (db: Db, content: Content): Promise<{ content: Content, keys: Set<string | null> }> {
  const keys = new Set<string | null>()
  const read: Content = { bodies: new Map(), files: new Map(), metadata: new Map(), events: new Map() }
  for (const id of content.bodies.keys()) {
    const [row] = await queryRows<{ body: string, sealed_by: string | null }>(db, sql`SELECT body, sealed_by FROM messages WHERE id = ${id}`)
    keys.add(row!.sealed_by)
    read.bodies.set(id, openText(row!.body, record.messageBody(id), row!.sealed_by))
    const [meta] = await queryRows<{ data: unknown, sealed_by: string | null }>(db, sql`SELECT data, sealed_by FROM metadata WHERE entity = ${id}`)
    keys.add(meta!.sealed_by)
    read.metadata.set(id, openJson(meta!.data, record.metadata(id), meta!.sealed_by))
  }
  for (const [key, file] of content.files) {
    const [messageId] = key.split('/') as [string]
    const [row] = await queryRows<{ filename: string, content_type: string, sha256: string, sealed_by: string | null }>(db, sql`
      SELECT filename, content_type, sha256, sealed_by FROM attachments WHERE message_id = ${messageId} AND n = 1`)
    keys.add(row!.sealed_by)
    const chunks = await queryRows<{ seq: number, data: Buffer, sealed_by: string | null }>(db, sql`
      SELECT seq, data, sealed_by FROM attachment_chunks WHERE upload_id = ${file.uploadId} ORDER BY seq`)
    const bytes = Buffer.concat(chunks.map((chunk) => {
      keys.add(chunk.sealed_by)
      const stored = toBuffer(chunk.data)
      return chunk.sealed_by === null ? stored : keyring().open(stored, record.attachmentChunk(file.uploadId, chunk.seq), chunk.sealed_by)
    }))
    read.files.set(key, {
      filename: openText(row!.filename, record.attachmentFilename(messageId, 1), row!.sealed_by),
      contentType: openText(row!.content_type, record.attachmentContentType(messageId, 1), row!.sealed_by),
      sha256: openText(row!.sha256, record.attachmentSha256(messageId, 1), row!.sealed_by),
      bytes,
      uploadId: file.uploadId
    })
  }
  for (const key of content.events.keys()) {
    const [address, seq] = key.split('/') as [string, string]
    const [row] = await queryRows<{ type: string, message_id: string, data: unknown, sealed_by: string | null }>(db, sql`
      SELECT type, message_id, data, sealed_by FROM events WHERE address = ${address} AND seq = ${Number(seq)}`)
    keys.add(row!.sealed_by)
    read.events.set(key, openJson(row!.data, record.eventData(row!.type, row!.message_id), row!.sealed_by))
  }
  return { content: read, keys }
}
