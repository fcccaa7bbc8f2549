import { createHash } from 'node:crypto'
import { request } from 'node:http'
import { Readable } from 'node:stream'
import t from 'tap'
import { usingPostgres } from '../support/databases.js'
import { build } from '../helper.js'

const FILES = 10
const FILE_BYTES = 25 * 1024 * 1024
const skip = usingPostgres() ? 'embedded mode only: PGlite is one connection, so a long statement would block everyone' : false

/** File i's bytes, generated piece by piece (never held whole): 64 KiB blocks of a counter. */
function * fileBlocks (i: number): Generator<Buffer> {
  const block = Buffer.alloc(64 * 1024)
  for (let b = 0; b * block.length < FILE_BYTES; b++) {
    block.fill((i * 31 + b) & 0xff)
    block.writeUInt32BE(b, 0)
    yield Buffer.from(block)
  }
}

t.test(`one 10 x ${FILE_BYTES / 1048576} MiB send on PGlite leaves a bystander answering, every file intact`, { skip }, async (t) => {
  const { app, as } = await build(t)
  const alice = await as('alice')
  const bob = await as('bob')
  await app.listen({ port: 0, host: '127.0.0.1' })
  const { port } = app.server.address() as { port: number }

  const boundary = 'bigBOUNDARY'
  const expected: string[] = []
  const parts = function * () {
    yield Buffer.from(`--${boundary}\r\nContent-Disposition: form-data; name="recipient"\r\n\r\nbob\r\n`)
    for (let i = 0; i < FILES; i++) {
      yield Buffer.from(`--${boundary}\r\nContent-Disposition: form-data; name="attachment"; filename="f${i}.bin"\r\nContent-Type: application/octet-stream\r\n\r\n`)
      const hash = createHash('sha256')
      for (const block of fileBlocks(i)) { hash.update(block); yield block }
      expected.push(hash.digest('hex'))
      yield Buffer.from('\r\n')
    }
    yield Buffer.from(`--${boundary}--\r\n`)
  }
  const sending = new Promise<{ status: number, body: string }>((resolve, reject) => {
    const req = request({ port, host: '127.0.0.1', method: 'POST', path: '/v2/message', headers: { authorization: alice.authorization, 'content-type': `multipart/form-data; boundary=${boundary}` } }, (res) => {
      let body = ''
      res.on('data', (c: Buffer) => { body += c.toString() })
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }))
    })
    req.on('error', reject)
    Readable.from(parts()).pipe(req)
  })

  // A bystander reads its own feed over and over: alone first, then while the upload runs.
  const read = async (): Promise<number> => {
    const started = performance.now()
    const res = await fetch(`http://127.0.0.1:${port}/v2/events?wait=0`, { headers: { authorization: bob.authorization } })
    await res.arrayBuffer()
    return performance.now() - started
  }
  for (let i = 0; i < 5; i++) await read()
  let aloneWorst = 0
  for (let i = 0; i < 20; i++) aloneWorst = Math.max(aloneWorst, await read())
  let done = false
  const latencies: number[] = []
  const bystander = (async () => {
    while (!done) {
      latencies.push(await read())
      await new Promise((resolve) => setTimeout(resolve, 50))
    }
  })()
  const started = performance.now()
  const sent = await sending
  const seconds = (performance.now() - started) / 1000
  done = true
  await bystander
  t.equal(sent.status, 200, sent.body.slice(0, 300))
  const worst = Math.max(...latencies)
  t.comment(`upload ${(FILES * FILE_BYTES / 1048576 / seconds).toFixed(1)} MiB/s; bystander worst ${worst.toFixed(0)} ms over ${latencies.length} requests`)
  t.ok(latencies.length >= 3, `${latencies.length} bystander requests answered during the upload`)
  // PGlite runs on the event loop's thread, so every chunk's insert is time nobody else is
  // answered. Measured: 247 ms worst, 20 MiB/s. Before chunking a bystander waited out the whole
  // send statement (34 s); with PGlite's own bytea conversion and no turn of the event loop
  // between chunks, 1.2–1.9 s, and the upload took 45 s on disk.
  // Relative to the bystander alone on this machine now (a busy machine slows both), at least
  // 1 s, at most 5 s: a stall on the upload's work still fails.
  const bound = Math.min(5000, Math.max(1000, 8 * aloneWorst))
  t.ok(worst < bound, `bystander's slowest answer ${worst.toFixed(0)} ms < ${bound.toFixed(0)} ms (alone: worst ${aloneWorst.toFixed(0)} ms)`)

  const message = JSON.parse(sent.body) as { id: string }
  for (let i = 0; i < FILES; i++) {
    const res = await fetch(`http://127.0.0.1:${port}/v2/message/${message.id}/attachment/${i + 1}`, { headers: { authorization: bob.authorization } })
    const hash = createHash('sha256')
    for await (const chunk of res.body!) hash.update(chunk)
    t.equal(hash.digest('hex'), expected[i], `file ${i + 1} read back intact`)
  }
})
