import { createHash, randomBytes } from 'node:crypto'
import { connect } from 'node:net'
import { Readable } from 'node:stream'
import t from 'tap'
import { sql } from 'drizzle-orm'
import { queryRows } from '../../../src/db/rows.js'
import { readUpload } from '../../../src/modules/messages/uploads.js'
import type { Db } from '../../../src/db/client.js'
import { build } from '../../helper.js'
import { until } from '../../support/until.js'

function form (fields: Record<string, string>, files: { data: Buffer, type: string, filename: string }[]): FormData {
  const body = new FormData()
  for (const [name, value] of Object.entries(fields)) body.append(name, value)
  for (const file of files) body.append('attachment', new Blob([new Uint8Array(file.data)], { type: file.type }), file.filename)
  return body
}

async function chunkCounts (db: Db): Promise<{ staged: number, claimed: number }> {
  const [row] = await queryRows<{ staged: number, claimed: number }>(db, sql`
    SELECT count(*) FILTER (WHERE message_id IS NULL)::int AS staged, count(*) FILTER (WHERE message_id IS NOT NULL)::int AS claimed
    FROM attachment_chunks`)
  return row!
}

t.test('a file over several chunks streams back whole and by Range, with ETag, 304 and 416', async (t) => {
  const { as, db } = await build(t)
  const alice = await as('alice')
  await as('bob')
  // 700 KiB + 3: three 256 KiB chunks, the last one short.
  const data = randomBytes(700 * 1024 + 3)
  const sha = createHash('sha256').update(data).digest('hex')
  const sent = await alice.post('/v2/message', form({ recipient: 'bob' }, [{ data, type: 'application/octet-stream', filename: 'blob.bin' }]))
  t.equal(sent.statusCode, 200, sent.body)
  const url = `/v2/message/${sent.json().id}/attachment/1`
  t.same(await chunkCounts(db), { staged: 0, claimed: 3 }, 'stored as three chunks, all claimed by the message')

  const whole = await alice.get(url)
  t.equal(whole.statusCode, 200)
  t.ok(whole.rawPayload.equals(data), 'whole file intact')
  const etag = whole.headers.etag as string
  t.match(etag, /^"[0-9a-f]{32}"$/, 'ETag is a quoted keyed tag')
  t.notOk(etag.includes(sha.slice(0, 16)), 'not the SHA-256, which would confirm a guess of the content')
  t.equal(whole.headers['accept-ranges'], 'bytes')
  t.equal(whole.headers['content-length'], String(data.length))
  t.equal(whole.headers['cache-control'], 'private, no-store')
  t.equal(whole.headers['x-content-type-options'], 'nosniff')

  const cases: [string, number, number][] = [
    ['bytes=0-0', 0, 0],
    ['bytes=262140-262150', 262140, 262150], // across the first chunk boundary
    ['bytes=100-', 100, data.length - 1],
    ['bytes=-10', data.length - 10, data.length - 1],
    [`bytes=500000-${data.length + 999}`, 500000, data.length - 1] // end clamped to the size
  ]
  for (const [range, start, end] of cases) {
    const res = await alice.get(url, { headers: { range } })
    t.equal(res.statusCode, 206, range)
    t.equal(res.headers['content-range'], `bytes ${start}-${end}/${data.length}`, range)
    t.equal(res.headers['content-length'], String(end - start + 1), range)
    t.ok(res.rawPayload.equals(data.subarray(start, end + 1)), `${range}: the right bytes`)
  }

  const past = await alice.get(url, { headers: { range: `bytes=${data.length}-` } })
  t.equal(past.statusCode, 416)
  t.equal(past.headers['content-range'], `bytes */${data.length}`)
  t.match(past.json(), { statusCode: 416, code: 'RANGE_NOT_SATISFIABLE', message: /range/ })

  const cached = await alice.get(url, { headers: { 'if-none-match': etag } })
  t.equal(cached.statusCode, 304)
  t.equal(cached.rawPayload.length, 0)
  t.equal(cached.headers.etag, etag, 'the same ETag again')
  t.equal((await alice.get(url, { headers: { 'if-none-match': `"${sha}"` } })).statusCode, 200, 'the plain SHA-256 is no validator')
  t.equal((await alice.get(url, { headers: { 'if-none-match': '"other"' } })).statusCode, 200, 'another tag gets the file')
})

t.test('the attachment index accepts only canonical digits', async (t) => {
  const { as } = await build(t)
  const alice = await as('alice')
  await as('bob')
  const sent = await alice.post('/v2/message', form({ recipient: 'bob' }, [{ data: Buffer.from('hi'), type: 'text/plain', filename: 'a.txt' }]))
  const base = `/v2/message/${sent.json().id}/attachment/`
  t.equal((await alice.get(`${base}1`)).statusCode, 200)
  for (const n of ['01', '1e0', '%201', '+1', '1.0', '0', '-1']) {
    const res = await alice.get(`${base}${n}`)
    t.equal(res.statusCode, 400, `/${n} is refused`)
    t.match(res.json(), { code: 'VALIDATION_FAILED', message: /n/ })
  }
  t.equal((await alice.get(`${base}2`)).statusCode, 404)
})

t.test('stored filenames lose bidi controls as well as control characters', async (t) => {
  const { as } = await build(t)
  const alice = await as('alice')
  await as('bob')
  const sneaky = 'invoice\u202Efdp.exe\u2066\u2069\u202A\u202B\u202C\u202D\u2067\u2068\u0007.txt'
  const sent = await alice.post('/v2/message', form({ recipient: 'bob' }, [{ data: Buffer.from('x'), type: 'text/plain', filename: sneaky }]))
  t.equal(sent.statusCode, 200, sent.body)
  t.equal(sent.json().attachments[0].filename, 'invoicefdp.exe.txt')
})

t.test('a refused send leaves none of its staged chunks behind', async (t) => {
  const { as, db } = await build(t)
  const alice = await as('alice')
  const res = await alice.post('/v2/message', form({ recipient: 'nobody' }, [{ data: randomBytes(600 * 1024), type: 'application/octet-stream', filename: 'x.bin' }]))
  t.equal(res.statusCode, 404)
  await until(async () => (await chunkCounts(db)).staged === 0, { message: 'timed out waiting for staged chunks deleted' })
  t.same(await chunkCounts(db), { staged: 0, claimed: 0 })
})

t.test('an upload whose client drops the socket mid-body leaves no staged rows and logs a client abort', async (t) => {
  const { app, as, db, logs } = await build(t)
  const alice = await as('alice')
  await as('bob')
  await app.listen({ port: 0, host: '127.0.0.1' })
  const { port } = app.server.address() as { port: number }
  const boundary = 'xxBOUNDARYxx'
  const head = Buffer.from(`--${boundary}\r\nContent-Disposition: form-data; name="recipient"\r\n\r\nbob\r\n` +
    `--${boundary}\r\nContent-Disposition: form-data; name="attachment"; filename="big.bin"\r\nContent-Type: application/octet-stream\r\n\r\n`)
  const socket = connect(port, '127.0.0.1')
  await new Promise<void>((resolve) => socket.once('connect', resolve))
  socket.write(`POST /v2/message HTTP/1.1\r\nHost: x\r\nAuthorization: ${alice.authorization}\r\n` +
    `Content-Type: multipart/form-data; boundary=${boundary}\r\nContent-Length: ${head.length + 20 * 1024 * 1024}\r\n\r\n`)
  socket.write(head)
  // Two chunks' worth and a bit: some of it is staged before the client goes.
  socket.write(randomBytes(600 * 1024))
  await until(async () => (await chunkCounts(db)).staged >= 2, { message: 'timed out waiting for chunks staged' })
  socket.destroy()
  await until(async () => (await chunkCounts(db)).staged === 0, { message: 'timed out waiting for staged chunks deleted' })
  t.same(await chunkCounts(db), { staged: 0, claimed: 0 }, 'nothing left')
  await until(() => logs().includes('upload aborted by the client'), { message: 'timed out waiting for the abort logged' })
  t.notMatch(logs(), /"level":50/, 'no error logged (not a database outage)')
  const [row] = await queryRows<{ n: number }>(db, sql`SELECT count(*)::int AS n FROM messages`)
  t.equal(row!.n, 0, 'no message')
})

t.test('small files ride in the send\'s own statement, up to one chunk a request; the rest is staged', async (t) => {
  const sink = { staged: [] as string[], async stage (uploadId: string) { this.staged.push(uploadId) }, async discard () { return 0 } }
  const progress = { writes: 0, inlineBytesLeft: 256 * 1024 }
  const part = (bytes: number) => Object.assign(Object.create(null) as object, {
    file: Object.assign(Readable.from([randomBytes(bytes)]), { truncated: false }), filename: 'f.bin', mimetype: 'application/octet-stream'
  }) as unknown as Parameters<typeof readUpload>[0]
  const first = await readUpload(part(100 * 1024), sink, 256 * 1024, progress)
  const second = await readUpload(part(100 * 1024), sink, 256 * 1024, progress)
  const third = await readUpload(part(100 * 1024), sink, 256 * 1024, progress)
  const empty = await readUpload(part(0), sink, 256 * 1024, progress)
  t.same([first.staged, second.staged, third.staged, empty.staged], [false, false, true, false], 'two fit the request\'s 256 KiB, the third is staged, an empty one costs nothing')
  t.equal(first.bytes?.length, 100 * 1024)
  t.same(sink.staged, [third.uploadId], 'one chunk staged, for the third file only')
  t.equal(progress.inlineBytesLeft, 56 * 1024)

  const { as, db } = await build(t)
  const alice = await as('alice')
  const bob = await as('bob')
  const files = [randomBytes(100 * 1024), randomBytes(100 * 1024), randomBytes(100 * 1024), randomBytes(0), randomBytes(300 * 1024)]
  const refused = await alice.post('/v2/message', form({ recipient: 'nobody' }, files.map((data, i) => ({ data, type: 'application/octet-stream', filename: `f${i}` }))))
  t.equal(refused.statusCode, 404)
  await until(async () => (await chunkCounts(db)).staged === 0, { message: 'timed out waiting for staged chunks deleted' })
  t.same(await chunkCounts(db), { staged: 0, claimed: 0 }, 'a refused send with small and large files leaves no chunk')
  const sent = await alice.post('/v2/message', form({ recipient: 'bob' }, files.map((data, i) => ({ data, type: 'application/octet-stream', filename: `f${i}` }))))
  t.equal(sent.statusCode, 200, sent.body)
  for (let i = 0; i < files.length; i++) {
    const res = await bob.get(`/v2/message/${sent.json().id}/attachment/${i + 1}`)
    t.equal(res.statusCode, 200)
    t.equal(createHash('sha256').update(res.rawPayload).digest('hex'), createHash('sha256').update(files[i]!).digest('hex'), `file ${i + 1} (${files[i]!.length} bytes) read back whole`)
  }
  t.same(await chunkCounts(db), { staged: 0, claimed: 5 }, 'two inline chunks, one staged small file, two chunks of the large one')
})

/** One raw HTTP/1.1 exchange per request on one kept-alive socket: each answer's head and body bytes as they came. */
async function rawExchanges (port: number, requests: string[]): Promise<{ head: string, body: Buffer }[]> {
  const socket = connect(port, '127.0.0.1')
  await new Promise((resolve, reject) => socket.once('connect', resolve).once('error', reject))
  let pending = Buffer.alloc(0)
  socket.on('data', (chunk: Buffer) => { pending = Buffer.concat([pending, chunk]) })
  const answers: { head: string, body: Buffer }[] = []
  try {
    for (const request of requests) {
      socket.write(request)
      await until(() => pending.includes('\r\n\r\n'), { timeoutMs: 5_000, message: 'timed out waiting for an answer\'s head' })
      const end = pending.indexOf('\r\n\r\n')
      const head = pending.subarray(0, end).toString('latin1')
      const length = /^content-length: *(\d+)/im.exec(head)
      const bodyLength = head.startsWith('HTTP/1.1 304') ? 0 : Number(length?.[1] ?? 0)
      await until(() => pending.length >= end + 4 + bodyLength, { timeoutMs: 5_000, message: 'timed out waiting for an answer\'s body' })
      answers.push({ head, body: pending.subarray(end + 4, end + 4 + bodyLength) })
      pending = pending.subarray(end + 4 + bodyLength)
    }
    // Nothing stray after the last answer (a 304's "null" would show here or in the next head):
    // whatever came after it arrives before the answer to one more request on the connection.
    socket.write('GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n')
    await until(() => pending.includes('\r\n\r\n'), { timeoutMs: 5_000, message: 'timed out waiting for the last answer\'s head' })
    const last = pending.indexOf('HTTP/1.1 ')
    const stray = last < 0 ? pending : pending.subarray(0, last)
    if (stray.length > 0) answers.push({ head: 'STRAY', body: stray })
  } finally {
    socket.destroy()
  }
  return answers
}

t.test('a 304 has no body, no Content-Length nor JSON type, keeps its ETag; If-Range with a stale validator gets the whole file', async (t) => {
  const { app, as } = await build(t)
  const alice = await as('alice')
  await as('bob')
  const data = randomBytes(1000)
  const sent = await alice.post('/v2/message', form({ recipient: 'bob' }, [{ data, type: 'application/octet-stream', filename: 'blob.bin' }]))
  const path = `/v2/message/${sent.json().id}/attachment/1`
  const etag = (await alice.get(path)).headers.etag as string
  await app.listen({ port: 0, host: '127.0.0.1' })
  const { port } = app.server.address() as { port: number }
  const request = (headers: string) => `GET ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: ${alice.authorization}\r\n${headers}\r\n`

  const [notModified, after, ...stray] = await rawExchanges(port, [request(`If-None-Match: ${etag}\r\n`), request('Range: bytes=0-9\r\n')])
  t.match(notModified!.head, /^HTTP\/1\.1 304 /)
  t.notMatch(notModified!.head, /^content-length:/im, 'no Content-Length on a 304')
  t.notMatch(notModified!.head, /^content-type: *application\/json/im, 'no JSON type on a 304')
  t.match(notModified!.head, new RegExp(`^etag: ${etag}`, 'im'), 'the ETag is kept')
  t.match(after!.head, /^HTTP\/1\.1 206 /, 'the next answer on the same connection starts where the 304 ended')
  t.ok(after!.body.equals(data.subarray(0, 10)))
  t.same(stray, [], 'no bytes after the last answer')

  // Through fetch (undici), the 304 completes at once and the connection serves the next request.
  const headers = { authorization: alice.authorization }
  const fetched = await fetch(`http://127.0.0.1:${port}${path}`, { headers: { ...headers, 'if-none-match': etag }, signal: AbortSignal.timeout(3_000) })
  t.equal(fetched.status, 304)
  t.equal((await fetched.arrayBuffer()).byteLength, 0)

  const ranged = (ifRange: string) => fetch(`http://127.0.0.1:${port}${path}`, { headers: { ...headers, range: 'bytes=0-9', 'if-range': ifRange }, signal: AbortSignal.timeout(3_000) })
  const current = await ranged(etag)
  t.equal(current.status, 206, 'If-Range naming the current ETag: the range')
  t.ok(Buffer.from(await current.arrayBuffer()).equals(data.subarray(0, 10)))
  for (const stale of ['"0000"', `W/${etag}`, 'Tue, 01 Jan 2030 00:00:00 GMT']) {
    const res = await ranged(stale)
    t.equal(res.status, 200, `If-Range ${stale}: the whole file`)
    t.equal(res.headers.get('content-range'), null)
    t.ok(Buffer.from(await res.arrayBuffer()).equals(data), `If-Range ${stale}: every byte`)
  }
  const unsatisfiable = await fetch(`http://127.0.0.1:${port}${path}`, { headers: { ...headers, range: 'bytes=5000-', 'if-range': '"old"' } })
  t.equal(unsatisfiable.status, 200, 'a range that no longer fits, with a stale If-Range: the whole file, not 416')
  await unsatisfiable.arrayBuffer()
})
