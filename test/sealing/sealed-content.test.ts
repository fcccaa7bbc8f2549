import { createHash, randomBytes } from 'node:crypto'
import { sql } from 'drizzle-orm'
import t from 'tap'
import type { Db } from '../../src/db/client.js'
import { queryRows } from '../../src/db/rows.js'
import { build, type Caller } from '../helper.js'
import { json, messageLines, unzip } from '../modules/export/support.js'

/**
 * Sealed at rest (API.md §11), for what this file's modules hold: attachment chunks (staged in
 * several chunks, and read back whole, by Range and in an export), the names and types a
 * message lists, metadata maps, idempotency records. The tables are read directly, every
 * column as text, and no canary may be found in them, while the API answers all of it as sent.
 */

const CANARY = 'canary-sealed-7f3a'

/**
 * Every column of the sealed rows of these tables, as text (bytea also as escaped bytes, so a
 * plain canary shows), and the tables' plain rows (sealed_by NULL) by table.
 */
async function tableText (db: Db, tables: string[]): Promise<{ text: string, plain: Record<string, number> }> {
  let text = ''
  const plain: Record<string, number> = {}
  for (const table of tables) {
    const [row] = await queryRows<{ text: string | null, plain: number }>(db, sql`
      SELECT string_agg(concat_ws(' ', t::text, ${table === 'attachment_chunks' ? sql`encode(t.data, 'escape')` : sql`''`}), ' ')
          FILTER (WHERE t.sealed_by IS NOT NULL) AS text,
        count(*) FILTER (WHERE t.sealed_by IS NULL)::int AS plain
      FROM ${sql.identifier(table)} t`)
    text += `${row?.text ?? ''}\n`
    plain[table] = row?.plain ?? 0
  }
  return { text, plain }
}

/** A file whose every 4 KiB says the canary: a copy of any part of it in the clear shows. */
function canaryFile (bytes: number): Buffer {
  const unit = Buffer.from(`${CANARY} `.repeat(4096 / (CANARY.length + 1)).padEnd(4096, '.'))
  return Buffer.concat(Array.from({ length: Math.ceil(bytes / unit.length) }, () => unit)).subarray(0, bytes)
}

function form (fields: Record<string, string>, files: { data: Buffer, type: string, filename: string }[]): FormData {
  const body = new FormData()
  for (const [name, value] of Object.entries(fields)) body.append(name, value)
  for (const file of files) body.append('attachment', new Blob([new Uint8Array(file.data)], { type: file.type }), file.filename)
  return body
}

async function sendFiles (alice: Caller, files: { data: Buffer, type: string, filename: string }[]): Promise<string> {
  const sent = await alice.post('/v2/message', form({ recipient: 'bob', body: 'see attached' }, files))
  if (sent.statusCode !== 200) throw new Error(sent.body)
  return sent.json().id as string
}

t.test('files, their names and types, and metadata reach the tables sealed; the API answers them as sent', async (t) => {
  const { as, db } = await build(t)
  const alice = await as('alice')
  const bob = await as('bob')
  // 600 KiB + 7: staged as three chunks, the last short; a small one held whole (the send's own chunk).
  const large = canaryFile(600 * 1024 + 7)
  const small = canaryFile(3000)
  const largeId = await sendFiles(alice, [{ data: large, type: 'application/x-canary', filename: `${CANARY}.bin` }])
  const smallId = await sendFiles(alice, [{ data: small, type: 'text/plain', filename: `${CANARY}-note.txt` }])
  const metadata = { note: `${CANARY} note`, nested: { deep: [CANARY, 1] } }
  t.equal((await alice.post('/v2/metadata/alice', metadata)).statusCode, 200)
  t.equal((await alice.post(`/v2/metadata/${largeId}`, { label: CANARY })).statusCode, 200)

  const [staged] = await queryRows<{ n: number, sealed: number, stored: number }>(db, sql`
    SELECT count(*)::int AS n, count(sealed_by)::int AS sealed, sum(octet_length(data))::int AS stored FROM attachment_chunks
    WHERE upload_id = (SELECT upload_id FROM attachments WHERE message_id = ${largeId})`)
  t.same(staged, { n: 3, sealed: 3, stored: large.length + 3 * 28 }, 'three chunks, each sealed whole (28 bytes more)')
  const [meta] = await queryRows<{ sealed: number }>(db, sql`SELECT count(sealed_by)::int AS sealed FROM metadata WHERE data <> '{}'::jsonb`)
  t.equal(meta!.sealed, 2, 'both maps are sealed')
  const dump = await tableText(db, ['attachment_chunks', 'attachments', 'metadata'])
  t.notOk(dump.text.includes(CANARY), 'no sealed chunk, file name, type or map holds the canary')
  // What the send statement writes itself (the attachments rows, a small file's one chunk held
  // in memory) it seals too (send-batch.repository.ts): no row is plain.
  t.same(dump.plain, { attachment_chunks: 0, attachments: 0, metadata: 0 }, 'no plain row')

  for (const [id, data, type, name] of [[largeId, large, 'application/x-canary', `${CANARY}.bin`], [smallId, small, 'text/plain', `${CANARY}-note.txt`]] as const) {
    const res = await bob.get(`/v2/message/${id}/attachment/1`)
    t.equal(res.statusCode, 200)
    t.ok(res.rawPayload.equals(data), `${name}: every byte`)
    t.equal(res.headers['content-type'], type)
    t.match(res.headers['content-disposition'], name)
    const listed = (await bob.get(`/v2/message/${id}`)).json().attachments
    t.same(listed, [{ index: 1, filename: name, contentType: type, size: data.length }], `${name}: listed as sent`)
  }
  // Across the first chunk boundary, and one byte of the last chunk.
  for (const [start, end] of [[262140, 262150], [large.length - 1, large.length - 1], [100, 600000]] as const) {
    const res = await bob.get(`/v2/message/${largeId}/attachment/1`, { headers: { range: `bytes=${start}-${end}` } })
    t.equal(res.statusCode, 206)
    t.ok(res.rawPayload.equals(large.subarray(start, end + 1)), `bytes ${start}-${end}`)
  }
  t.same((await alice.get('/v2/metadata/alice')).json().metadata, metadata, 'the map as written')
  const merged = await alice.post('/v2/metadata/alice', { note: null, more: 'x' })
  t.same(merged.json().metadata, { nested: metadata.nested, more: 'x' }, 'a merge reads the sealed map and writes it sealed again')

  const archive = await alice.get('/v2/export')
  t.equal(archive.statusCode, 200)
  const { files } = await unzip(archive.rawPayload)
  t.ok(files.get(`attachments/${largeId}/1-${CANARY}.bin`)?.equals(large), 'the export has the large file whole, under its name')
  t.ok(files.get(`attachments/${smallId}/1-${CANARY}-note.txt`)?.equals(small), 'and the small one')
  t.match(json(files, 'metadata.json'), { entity: 'alice', metadata: { nested: metadata.nested, more: 'x' } }, 'its own metadata')
  t.same(messageLines(files).find((m) => m.id === largeId)?.metadata, { label: CANARY }, 'a message\'s metadata')
})

t.test('the ETag is a keyed tag of the file, not its SHA-256, and still validates', async (t) => {
  const { as } = await build(t)
  const alice = await as('alice')
  await as('bob')
  const data = randomBytes(2000)
  const sha = createHash('sha256').update(data).digest('hex')
  const url = `/v2/message/${await sendFiles(alice, [{ data, type: 'application/octet-stream', filename: 'a.bin' }])}/attachment/1`
  const etag = (await alice.get(url)).headers.etag as string
  t.match(etag, /^"[0-9a-f]{32}"$/)
  t.notOk(etag.includes(sha.slice(0, 12)), 'no part of the SHA-256')
  const again = `/v2/message/${await sendFiles(alice, [{ data, type: 'application/octet-stream', filename: 'b.bin' }])}/attachment/1`
  t.equal((await alice.get(again)).headers.etag, etag, 'the same content has the same ETag')
  t.equal((await alice.get(url, { headers: { 'if-none-match': etag } })).statusCode, 304)
  t.equal((await alice.get(url, { headers: { 'if-none-match': `"${sha}"` } })).statusCode, 200)
  const ranged = await alice.get(url, { headers: { range: 'bytes=0-9', 'if-range': etag } })
  t.equal(ranged.statusCode, 206, 'If-Range with the ETag')
})

t.test('a record sealed under a key no longer configured answers 503 SEALED_KEY_MISSING naming it', async (t) => {
  const { as, db } = await build(t)
  const alice = await as('alice')
  const bob = await as('bob')
  const id = await sendFiles(alice, [{ data: canaryFile(300 * 1024), type: 'application/octet-stream', filename: 'f.bin' }])
  await alice.post(`/v2/metadata/${id}`, { label: 'x' })
  await db.execute(sql`UPDATE attachment_chunks SET sealed_by = 'gone' WHERE seq = 1`)
  await db.execute(sql`UPDATE metadata SET sealed_by = 'gone' WHERE entity = ${id}`)
  const whole = await bob.get(`/v2/message/${id}/attachment/1`, { headers: { range: 'bytes=262144-262150' } })
  t.equal(whole.statusCode, 503, 'a range in the chunk under the missing key')
  t.match(whole.json(), { code: 'SEALED_KEY_MISSING', message: /"gone"/ })
  const first = await bob.get(`/v2/message/${id}/attachment/1`, { headers: { range: 'bytes=0-9' } })
  t.equal(first.statusCode, 206, 'a range in a chunk under a configured key still reads')
  const meta = await bob.get(`/v2/metadata/${id}`)
  t.equal(meta.statusCode, 503)
  t.match(meta.json(), { code: 'SEALED_KEY_MISSING', message: /"gone"/ })
})

t.test('an edit\'s Idempotency-Key record holds a keyed tag; a repeat replays, another body is refused', async (t) => {
  const { as, db } = await build(t)
  const alice = await as('alice')
  await as('bob')
  const sent = (await alice.post('/v2/message', { recipient: 'bob', body: 'first' })).json()
  const body = `${CANARY} edited`
  const edit = () => alice.patch(`/v2/message/${sent.id}`, { body }, { headers: { 'idempotency-key': 'e1' } })
  t.equal((await edit()).statusCode, 200)
  const again = await edit()
  t.equal(again.statusCode, 200)
  t.equal(again.headers['idempotent-replayed'], 'true')
  const other = await alice.patch(`/v2/message/${sent.id}`, { body: 'else' }, { headers: { 'idempotency-key': 'e1' } })
  t.equal(other.statusCode, 422)
  const [row] = await queryRows<{ request_hash: string, sealed_by: string | null }>(db, sql`SELECT request_hash, sealed_by FROM idempotency_keys`)
  const plain = createHash('sha256').update(JSON.stringify({ edit: sent.id, body })).digest('hex')
  t.equal(row!.sealed_by, 'test', 'tagged under the active key')
  t.not(row!.request_hash, plain, 'not the plain SHA-256 of the request, which would confirm a guessed body')
})
