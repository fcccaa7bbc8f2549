import { randomBytes } from 'node:crypto'
import t from 'tap'
import Fastify from 'fastify'
import multipart from '@fastify/multipart'
import { parseWholeMultipart } from '../../../src/modules/messages/whole-multipart.js'
import { UploadedFile } from '../../../src/modules/messages/uploaded-file.js'
import { build } from '../../helper.js'

const BOUNDARY = 'b0undary'

function field (name: string, value: string, type?: string): string {
  return `--${BOUNDARY}\r\nContent-Disposition: form-data; name="${name}"\r\n${type === undefined ? '' : `Content-Type: ${type}\r\n`}\r\n${value}\r\n`
}

function file (name: string, filename: string, type: string, data: Buffer): Buffer {
  return Buffer.concat([
    Buffer.from(`--${BOUNDARY}\r\nContent-Disposition: form-data; name="${name}"; filename="${filename}"\r\nContent-Type: ${type}\r\n\r\n`),
    data,
    Buffer.from('\r\n')
  ])
}

function body (...parts: (string | Buffer)[]): Buffer {
  return Buffer.concat([...parts.map((p) => Buffer.from(p)), Buffer.from(`--${BOUNDARY}--\r\n`)])
}

const image = randomBytes(10 * 1024)

/** Each case: its body, its Content-Type (the boundary's by default), and the status both paths must answer. */
const cases: { name: string, body: Buffer, type?: string, status: number, sameStatusOnly?: boolean }[] = [
  { name: 'a body and two files', body: body(field('recipient', 'bob'), field('body', 'two files'), file('attachment', 'a.png', 'image/png', image), file('attachment', 'b.txt', 'text/plain', Buffer.from('hello'))), status: 200 },
  { name: 'an attachment alone', body: body(field('recipient', 'bob'), file('attachment', 'only.bin', 'application/octet-stream', image)), status: 200 },
  { name: 'an empty file', body: body(field('recipient', 'bob'), file('attachment', 'empty.txt', 'text/plain', Buffer.alloc(0))), status: 200 },
  { name: 'a filename with a path and bidi controls', body: body(field('recipient', 'bob'), file('attachment', '../../invoice\u202efdp.exe.txt', 'text/plain', Buffer.from('x'))), status: 200 },
  { name: 'a type that is not type/subtype', body: body(field('recipient', 'bob'), file('attachment', 'a', 'not a type', Buffer.from('x'))), status: 200 },
  { name: 'a field typed application/json holding a string', body: body(field('recipient', 'bob'), field('body', '"quoted"', 'application/json')), status: 200 },
  { name: 'a field typed application/json that is not JSON', body: body(field('recipient', 'bob'), field('body', '{not json', 'application/json')), status: 400 },
  { name: 'a repeated recipient', body: body(field('recipient', 'bob'), field('recipient', 'carol'), field('body', 'hi')), status: 400 },
  { name: 'a field named __proto__', body: body(field('recipient', 'bob'), field('__proto__', 'x'), field('body', 'hi')), status: 400 },
  { name: 'a file named constructor', body: body(field('recipient', 'bob'), file('constructor', 'a.txt', 'text/plain', Buffer.from('x'))), status: 400 },
  { name: 'three files where two are allowed', body: body(field('recipient', 'bob'), ...['a', 'b', 'c'].map((n) => file('attachment', n, 'text/plain', Buffer.from(n)))), status: 400 },
  { name: 'a file over the size limit', body: body(field('recipient', 'bob'), file('attachment', 'big.bin', 'application/octet-stream', randomBytes(40 * 1024))), status: 413 },
  { name: 'more fields than allowed', body: body(field('recipient', 'bob'), ...Array.from({ length: 40 }, (_, i) => field(`f${i}`, 'x'))), status: 400 },
  { name: 'more fields than allowed, then a file too large', body: body(field('recipient', 'bob'), ...Array.from({ length: 40 }, (_, i) => field(`f${i}`, 'x')), file('attachment', 'big.bin', 'application/octet-stream', randomBytes(40 * 1024))), status: 400 },
  { name: 'three files, then a field named __proto__', body: body(field('recipient', 'bob'), ...['a', 'b', 'c'].map((n) => file('attachment', n, 'text/plain', Buffer.from(n))), field('__proto__', 'x')), status: 400 },
  { name: 'three files, then a field typed application/json that is not JSON', body: body(field('recipient', 'bob'), ...['a', 'b', 'c'].map((n) => file('attachment', n, 'text/plain', Buffer.from(n))), field('x', '{', 'application/json')), status: 400 },
  { name: 'thousands of empty parts', body: body(field('recipient', 'bob'), '--b0undary\r\n\r\n\r\n'.repeat(10_000)), status: 400 },
  { name: 'an epilogue of 1,000 delimiters after the closing one', body: Buffer.concat([body(field('recipient', 'bob'), field('body', 'hi')), Buffer.from('\r\n--b0undary\r\n\r\n'.repeat(1_000))]), status: 200 },
  { name: 'a body too long', body: body(field('recipient', 'bob'), field('body', 'x'.repeat(200))), status: 400 },
  { name: 'an empty body', body: Buffer.alloc(0), status: 400 },
  { name: 'a part cut short', body: Buffer.from(`${field('recipient', 'bob')}--${BOUNDARY}\r\nContent-Disposition: form-data; name="attachment"; filename="a"\r\n\r\nabc`), status: 400 },
  { name: 'no closing boundary after a complete field', body: Buffer.from(field('recipient', 'bob')), status: 400 },
  // busboy stalls on this part when handed it in large pieces, as from the socket (the stall
  // watchdog answers 400, "headers never end"), and in the slices it is fed whole it parses a
  // part with no name and ignores it (400, no recipient): the same status, not the same message.
  { name: 'a part of 100 KB with no headers', body: Buffer.concat([Buffer.from(`--${BOUNDARY}\r\n\r\n`), randomBytes(100_000), Buffer.from(`\r\n--${BOUNDARY}--\r\n`)]), status: 400, sameStatusOnly: true },
  { name: 'no boundary in the Content-Type', body: body(field('recipient', 'bob')), type: 'multipart/form-data', status: 400 }
]

/** The answer with what differs between two sends of the same message taken out. */
function comparable (text: string): unknown {
  const json = JSON.parse(text) as Record<string, unknown>
  const { id: _id, createdAt: _createdAt, ...rest } = json
  return rest
}

t.test('a multipart body read whole gets the answer it gets when streamed', async (t) => {
  const { app, as } = await build(t, { env: { MAX_ATTACHMENTS: '2', MAX_ATTACHMENT_BYTES: String(32 * 1024), MAX_BODY_CHARS: '100', RATE_LIMIT_PER_SECOND: '1000' } })
  const alice = await as('alice')
  await as('bob')
  await as('carol')
  await app.listen({ port: 0, host: '127.0.0.1' })
  const { port } = app.server.address() as { port: number }
  const send = async (c: typeof cases[number], streamed: boolean) => {
    const res = await fetch(`http://127.0.0.1:${port}/v2/message`, {
      method: 'POST',
      headers: { authorization: alice.authorization, 'content-type': c.type ?? `multipart/form-data; boundary=${BOUNDARY}` },
      // A stream goes chunked, with no Content-Length: the plugin's streaming path. A buffer
      // goes with its length: read whole.
      body: streamed ? new ReadableStream({ start (controller) { controller.enqueue(new Uint8Array(c.body)); controller.close() } }) : new Uint8Array(c.body),
      ...(streamed ? { duplex: 'half' } : {})
    } as RequestInit)
    return { status: res.status, body: comparable(await res.text()) }
  }
  for (const c of cases) {
    const whole = await send(c, false)
    const streamed = await send(c, true)
    t.equal(whole.status, c.status, `${c.name}: ${JSON.stringify(whole.body)}`)
    if (c.sameStatusOnly === true) t.equal(whole.status, streamed.status, `${c.name}: the same status both ways`)
    else t.same(whole, streamed, `${c.name}: the same answer both ways`)
  }
})

t.test('a body read whole always settles, however it is cut or corrupted', async (t) => {
  const app = Fastify()
  await app.register(multipart)
  await app.ready()
  t.teardown(() => app.close())
  const limits = { fileSize: 1024, files: 2, fields: 8, fieldSize: 256, headerPairs: 16, parts: 16 }
  const headers = { 'content-type': `multipart/form-data; boundary=${BOUNDARY}` }
  const whole = body(field('recipient', 'bob'), field('body', 'hello'), file('attachment', 'a.bin', 'application/octet-stream', randomBytes(300)))
  const parsed = await parseWholeMultipart(headers, whole, limits, app.multipartErrors)
  t.equal(parsed.recipient, 'bob')
  t.ok(parsed.attachment instanceof UploadedFile && parsed.attachment.size === 300, 'the file whole')
  const big = randomBytes(100_000)
  const headless = Buffer.concat([Buffer.from(`--${BOUNDARY}\r\n\r\n`), big, Buffer.from(`\r\n--${BOUNDARY}--\r\n`)])
  // Handed in one piece, busboy would wait for ever for this part's blank line; in slices it
  // sees a part with no headers, which it skips.
  t.same(await parseWholeMultipart(headers, headless, limits, app.multipartErrors), {}, 'a part of 100 KB with no headers settles, ignored')
  const empties = body(field('recipient', 'bob'), `--${BOUNDARY}\r\n\r\n\r\n`.repeat(16_000))
  const cpu = process.cpuUsage()
  await t.rejects(parseWholeMultipart(headers, empties, limits, app.multipartErrors), { code: 'FST_PARTS_LIMIT' }, '16,000 empty parts: the parts limit')
  const { user, system } = process.cpuUsage(cpu)
  t.comment(`16,000 empty parts refused in ${((user + system) / 1000).toFixed(1)} ms of CPU`)
  const large = await parseWholeMultipart(headers, body(file('attachment', 'large.bin', 'application/octet-stream', big)), { ...limits, fileSize: 200_000 }, app.multipartErrors)
  t.ok(large.attachment instanceof UploadedFile && large.attachment.bytes?.equals(big), 'a file larger than busboy\'s stream buffer arrives whole')
  let settled = 0
  const bodies: Buffer[] = []
  for (let cut = 0; cut < whole.length; cut += 7) bodies.push(whole.subarray(0, cut))
  for (let i = 0; i < 200; i++) {
    const corrupt = Buffer.from(whole)
    corrupt[Math.floor(Math.random() * corrupt.length)] = Math.floor(Math.random() * 256)
    bodies.push(corrupt)
  }
  for (const b of bodies) {
    // Settles means: resolves or rejects; a hang fails the test by its timeout.
    await parseWholeMultipart(headers, b, limits, app.multipartErrors).catch(() => {})
    settled++
  }
  t.equal(settled, bodies.length, `${bodies.length} cut or corrupted bodies all settled`)
})
