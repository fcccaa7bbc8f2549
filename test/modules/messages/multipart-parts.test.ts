import { randomBytes, randomInt } from 'node:crypto'
import { Writable } from 'node:stream'
import t from 'tap'
import { Busboy } from '@fastify/busboy'
import { boundaryOf, PartsCut } from '../../../src/modules/messages/multipart-parts.js'
import { build } from '../../helper.js'

/** Where the cut falls in a body held whole: before its (parts + 2)-th delimiter, matches not overlapping; else its length. */
function cutAt (body: Buffer, boundary: string, parts: number): number {
  const delimiter = Buffer.from('\r\n--' + boundary)
  let seen = 0
  for (let at = body.indexOf(delimiter); at !== -1; at = body.indexOf(delimiter, at + delimiter.length)) {
    if (++seen >= parts + 2) return at
  }
  return body.length
}

/** The body fed in pieces of random sizes (from 1 byte), and what the cut gave back, joined. */
function fedInPieces (body: Buffer, boundary: string, parts: number, largest: number): Buffer {
  const cut = new PartsCut(boundary, parts)
  const given: Buffer[] = []
  for (let at = 0; at < body.length;) {
    const size = randomInt(1, largest + 1)
    given.push(cut.take(body.subarray(at, at + size)))
    at += size
  }
  return Buffer.concat(given)
}

t.test('the cut falls where it falls in the body held whole, however the body is split into chunks', async (t) => {
  // Boundaries whose delimiters can overlap themselves ("\r\n--a\r\n-" twice in nine bytes) and
  // bodies dense with delimiters and their fragments, so matches split across chunks are common.
  const boundaries = ['b0undary', 'a\r\n-', '-', '--', 'x'.repeat(70)]
  let checked = 0
  for (const boundary of boundaries) {
    const pieces = ['\r\n--' + boundary, '\r\n', '--', '\r\n-', boundary, 'z', '\r\n--' + boundary.slice(0, -1)]
    for (let round = 0; round < 60; round++) {
      const body = Buffer.from(Array.from({ length: randomInt(1, 400) }, () => pieces[randomInt(pieces.length)]).join(''))
      const parts = randomInt(0, 40)
      const at = cutAt(body, boundary, parts)
      for (const largest of [1, 3, 16, 1024]) {
        // What was given before the chunk in which a split delimiter ends stays given: up to
        // all of that delimiter but its last byte, past the cut.
        const given = fedInPieces(body, boundary, parts, largest)
        if (!given.equals(body.subarray(0, given.length)) || given.length < at || given.length > at + boundary.length + 3) {
          t.fail(`boundary ${JSON.stringify(boundary)}, ${parts} parts, pieces up to ${largest} bytes: ${JSON.stringify(body.toString())}`)
          return
        }
        checked++
      }
    }
  }
  t.pass(`${checked} bodies cut where the whole body is cut, or within the delimiter there`)
})

t.test('a body within its parts limit is given to busboy whole, an epilogue of delimiters and all', async (t) => {
  const head = '--b\r\nContent-Disposition: form-data; name="f"\r\n\r\nx\r\n'
  const parts = head.repeat(5) + '--b--\r\n'
  const within = Buffer.from(parts + '\r\n--b\r\n\r\n'.repeat(100))
  t.ok(fedInPieces(within, 'b', 5, 7).length >= parts.length, 'five parts of five: cut only in the epilogue busboy ignores')
  const over = Buffer.from(head.repeat(6) + '--b--\r\n')
  t.ok(fedInPieces(over, 'b', 4, 7).length < over.length, 'six parts of four: cut')
  t.equal(boundaryOf({ 'content-type': 'multipart/form-data; BOUNDARY="a b;c"' }), 'a b;c', 'a quoted boundary, its name in any case, as busboy reads it')
  t.equal(boundaryOf({ 'content-type': 'multipart/form-data' }), undefined, 'none')
  t.equal(boundaryOf({}), undefined, 'no Content-Type')
})

t.test('a streamed body of empty parts reaches busboy only a few parts past the limit, and is refused as before', async (t) => {
  const { app, as } = await build(t, { env: { MAX_ATTACHMENTS: '2', RATE_LIMIT_PER_SECOND: '1000' } })
  const alice = await as('alice')
  await as('bob')
  await app.listen({ port: 0, host: '127.0.0.1' })
  const { port } = app.server.address() as { port: number }
  // Every byte any busboy is given in this process, the plugin's and the whole bodies' alike.
  let given = 0
  const write = Object.getOwnPropertyDescriptor(Busboy.prototype, 'write')
  Busboy.prototype.write = function (this: Writable, ...args: Parameters<Writable['write']>) {
    given += Buffer.byteLength(args[0] as Buffer)
    return Writable.prototype.write.apply(this, args)
  }
  t.teardown(() => {
    if (write === undefined) Reflect.deleteProperty(Busboy.prototype, 'write')
    else Object.defineProperty(Busboy.prototype, 'write', write)
  })
  const send = async (body: Buffer, streamed: boolean) => {
    given = 0
    const res = await fetch(`http://127.0.0.1:${port}/v2/message`, {
      method: 'POST',
      headers: { authorization: alice.authorization, 'content-type': 'multipart/form-data; boundary=b0undary' },
      body: streamed ? new ReadableStream({ start (c) { c.enqueue(new Uint8Array(body)); c.close() } }) : new Uint8Array(body),
      ...(streamed ? { duplex: 'half' } : {})
    } as RequestInit)
    return { status: res.status, body: await res.json() as { code?: string, message?: string }, given }
  }
  const head = '--b0undary\r\nContent-Disposition: form-data; name="recipient"\r\n\r\nbob\r\n'
  // The parts limit here: 32 fields and 2 files.
  const empties = Buffer.from(head + '--b0undary\r\n\r\n\r\n'.repeat(131_000) + '--b0undary--\r\n')
  for (const streamed of [true, false]) {
    const body = streamed ? empties : empties.subarray(0, 200 * 1024)
    const refused = await send(body, streamed)
    t.match(refused.body, { code: 'VALIDATION_FAILED', message: 'body: too many multipart parts' }, `${streamed ? 'streamed' : 'read whole'}: refused for its parts`)
    t.ok(refused.given < 2 * 1024, `${streamed ? 'streamed' : 'read whole'}: busboy was given ${refused.given} of its ${body.length} bytes`)
  }
  const file = randomBytes(300 * 1024)
  const sent = Buffer.concat([
    Buffer.from(head + '--b0undary\r\nContent-Disposition: form-data; name="attachment"; filename="a.bin"\r\nContent-Type: application/octet-stream\r\n\r\n'),
    file,
    Buffer.from('\r\n--b0undary--\r\n' + '\r\n--b0undary\r\n\r\n'.repeat(100))
  ])
  const accepted = await send(sent, true)
  t.equal(accepted.status, 200, 'a file and an epilogue of 100 delimiters: sent')
  t.ok(accepted.given >= sent.length - 100 * 14, 'busboy was given all of it up to the epilogue')
})
