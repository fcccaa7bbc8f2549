import { randomBytes, randomInt } from 'node:crypto'
import { Writable } from 'node:stream'
import t from 'tap'
import { Busboy } from '@fastify/busboy'
import { boundaryOf, gateParts, PartsGate } from '../../../src/modules/messages/multipart-parts.js'
import { build } from '../../helper.js'

/**
 * What busboy makes of `body` written in `chunks`-byte chunks, with the gate or without: its
 * events in order, up to and with its partsLimit (after which a gated busboy is given only the
 * closing delimiter), and how it ended; and how many bytes it parsed. A file is read 5 ms after
 * it begins, as the service's store reads one: busboy waits on it meanwhile.
 */
async function parse (body: Buffer, boundary: string, parts: number, chunks: number, gated: boolean): Promise<{ events: string[], parsed: number }> {
  const bb = new Busboy({ headers: { 'content-type': `multipart/form-data; boundary="${boundary}"` }, limits: { parts } })
  const events: string[] = []
  let limited = false
  const log = (event: string, always = false) => { if (!limited || always) events.push(event) }
  bb.on('field', (name: string, value: string) => log(`field ${name}=${value}`))
  bb.on('file', (name: string, stream: NodeJS.ReadableStream) => {
    log(`file ${name}`)
    stream.on('error', (err: Error) => log(`file error ${err.message}`, true))
    setTimeout(() => stream.resume(), 5)
  })
  bb.on('partsLimit', () => {
    log('partsLimit')
    limited = true
  })
  const ended = new Promise<void>((resolve) => {
    bb.on('finish', () => { log('finish', true); resolve() })
    bb.on('error', (err: Error) => { log(`error ${err.message}`, true); resolve() })
  })
  let parsed = 0
  const write = bb._write.bind(bb)
  bb._write = (chunk: Buffer, encoding: BufferEncoding, done: (err?: Error | null) => void) => {
    parsed += chunk.length
    write(chunk, encoding, done)
  }
  // Installed after the counter, as the service installs it on busboy's own _write.
  if (gated) gateParts(bb, new PartsGate(boundary, parts))
  for (let at = 0; at < body.length; at += chunks) {
    await new Promise<void>((resolve) => bb.write(body.subarray(at, at + chunks), () => resolve()))
  }
  bb.end()
  await ended
  return { events, parsed }
}

/**
 * A random well-formed body: empty parts, fields and files, then the closing delimiter and an
 * epilogue of delimiters and their fragments (which busboy ignores). Each is compared in chunks
 * of one size, gated or not: where chunks end moves busboy's events about its limit (a field
 * before or after the partsLimit), and of a malformed body (a dash right after a delimiter)
 * dicer's very reading, so busboy makes different things of one such body as the network
 * splits it; the gate's splits are one more way. The service test below sends two of them.
 */
function randomBody (boundary: string): Buffer {
  const d = `\r\n--${boundary}`
  const parts = [
    `${d}\r\n\r\n`,
    `${d}\r\nContent-Disposition: form-data; name="f${randomInt(100)}"\r\n\r\nv`,
    `${d}\r\nContent-Disposition: form-data; name="a"; filename="x"\r\nContent-Type: application/octet-stream\r\n\r\n${'y-\r\n'.repeat(randomInt(20))}`
  ]
  const epilogue = [d, `${d}\r\n\r\n`, `${d}-`, '\r\n', '-']
  const pick = (from: string[], most: number) => Array.from({ length: randomInt(most) }, () => from[randomInt(from.length)]).join('')
  return Buffer.from(pick(parts, 80) + `${d}--` + pick(epilogue, 60))
}

t.test('through the gate busboy makes of a well-formed body what it makes of it ungated, up to its partsLimit', async (t) => {
  let checked = 0
  let refused = 0
  for (const boundary of ['b0undary', 'a-b', 'x'.repeat(70)]) {
    for (let round = 0; round < 60; round++) {
      const body = randomBody(boundary)
      const parts = randomInt(1, 40)
      const chunks = [1, 7, 64, 65_536][round % 4]!
      const whole = await parse(body, boundary, parts, chunks, false)
      const gated = await parse(body, boundary, parts, chunks, true)
      if (JSON.stringify(gated.events) !== JSON.stringify(whole.events)) {
        t.same(gated.events, whole.events, `boundary ${boundary}, ${parts} parts, ${chunks}-byte chunks: ${JSON.stringify(body.toString())}`)
        return
      }
      if (whole.events.includes('partsLimit')) refused++
      checked++
    }
  }
  t.pass(`${checked} bodies, ${refused} over the limit: the same fields, files, refusal or end`)
  t.ok(refused > 0 && refused < checked, 'both kinds among them')
})

t.test('a body of empty parts is parsed a part past the limit; the pieces are always the chunk', async (t) => {
  const head = '--b\r\nContent-Disposition: form-data; name="f"\r\n\r\nx'
  const empties = Buffer.from(head + '\r\n--b\r\n\r\n'.repeat(16_000) + '\r\n--b--\r\n')
  const whole = await parse(empties, 'b', 34, 65_536, false)
  const gated = await parse(empties, 'b', 34, 65_536, true)
  t.same(gated.events, whole.events, 'refused alike')
  t.ok(gated.parsed < head.length + 40 * 9, `${gated.parsed} bytes parsed, against ${whole.parsed} ungated`)
  // Pieces join to their chunk, and no more come once the gate is closed.
  const gate = new PartsGate('b', 3)
  const pieces = gate.pieces(empties.subarray(0, 200))
  t.ok(Buffer.concat(pieces).equals(empties.subarray(0, 200)) && pieces.length > 5, `${pieces.length} pieces, the chunk joined`)
  gate.close()
  t.same(gate.pieces(empties.subarray(200, 300)), [], 'none once closed')
  t.equal(boundaryOf({ 'content-type': 'multipart/form-data; BOUNDARY="a b;c"' }), 'a b;c', 'a quoted boundary, its name in any case, as busboy reads it')
  t.equal(boundaryOf({ 'content-type': 'multipart/form-data' }), undefined, 'none')
  t.equal(boundaryOf({}), undefined, 'no Content-Type')
})

t.test('a service answers what busboy makes of a body: empty parts refused with a part parsed past the limit, odd bodies as before', async (t) => {
  const { app, as } = await build(t, { env: { MAX_ATTACHMENTS: '2', RATE_LIMIT_PER_SECOND: '1000' } })
  const alice = await as('alice')
  await as('bob')
  await app.listen({ port: 0, host: '127.0.0.1' })
  const { port } = app.server.address() as { port: number }
  // Every byte any busboy is given to parse in this process, the plugin's and the whole bodies' alike.
  let given = 0
  const parseChunk = Object.getOwnPropertyDescriptor(Busboy.prototype, '_write')!
  Busboy.prototype._write = function (this: Writable, chunk: Buffer, encoding: BufferEncoding, done: (err?: Error | null) => void) {
    given += chunk.length
    return (parseChunk.value as Writable['_write']).call(this, chunk, encoding, done)
  }
  t.teardown(() => { Object.defineProperty(Busboy.prototype, '_write', parseChunk) })
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
  const d = '\r\n--b0undary'
  const field = (name: string, value: string) => `${d}\r\nContent-Disposition: form-data; name="${name}"\r\n\r\n${value}`
  // The parts limit here: 32 fields and 2 files.
  const empties = Buffer.from(field('recipient', 'bob') + `${d}\r\n\r\n`.repeat(131_000) + `${d}--\r\n`)
  const tooMany = { code: 'VALIDATION_FAILED', message: 'body: too many multipart parts' }
  for (const streamed of [true, false]) {
    const body = streamed ? empties : empties.subarray(0, 200 * 1024)
    const refused = await send(body, streamed)
    t.match(refused.body, tooMany, `${streamed ? 'streamed' : 'read whole'}: refused for its parts`)
    t.ok(refused.given < 2 * 1024, `${streamed ? 'streamed' : 'read whole'}: busboy parsed ${refused.given} of its ${body.length} bytes`)
  }
  // Within the limit to busboy (19 parts), though it holds 37 delimiters: a dash then a
  // delimiter at once is no delimiter to dicer.
  const dashes = Buffer.from(field('recipient', 'bob') + field('body', 'hello') + `${d}-${d}\r\n\r\n`.repeat(17) + `${d}--\r\n`)
  // Over it, with the part past the limit empty (a delimiter right after another).
  const adjacent = Buffer.from(field('recipient', 'bob') + `${d}\r\n\r\n`.repeat(33) + d + `${d}\r\n\r\n`.repeat(1000) + `${d}--\r\n`)
  for (const streamed of [true, false]) {
    const way = streamed ? 'streamed' : 'read whole'
    t.equal((await send(dashes, streamed)).status, 200, `${way}: 17 delimiters after dashes, 19 parts: sent`)
    t.match((await send(adjacent, streamed)).body, tooMany, `${way}: 1,034 parts, the 35th empty: refused for its parts`)
  }
  // A file before the limit, still being stored when busboy refuses the rest: the refusal is
  // the answer, not the end of a body cut short (which destroyed that file's stream).
  const fileThenEmpties = Buffer.from(field('recipient', 'bob') +
    `${d}\r\nContent-Disposition: form-data; name="attachment"; filename="a.bin"\r\nContent-Type: application/octet-stream\r\n\r\n0123456789` +
    `${d}\r\n\r\n`.repeat(40) + `${d}--\r\n`)
  for (let run = 0; run < 3; run++) t.match((await send(fileThenEmpties, true)).body, tooMany, 'streamed: a 10-byte file, then 40 empty parts: refused for its parts')
  const file = randomBytes(300 * 1024)
  const sent = Buffer.concat([
    Buffer.from(field('recipient', 'bob') + `${d}\r\nContent-Disposition: form-data; name="attachment"; filename="a.bin"\r\nContent-Type: application/octet-stream\r\n\r\n`),
    file,
    Buffer.from(`${d}--\r\n` + `${d}\r\n\r\n`.repeat(100))
  ])
  const accepted = await send(sent, true)
  t.equal(accepted.status, 200, 'a file and an epilogue of 100 delimiters: sent')
  t.equal(accepted.given, sent.length, 'busboy parsed all of it')
})
