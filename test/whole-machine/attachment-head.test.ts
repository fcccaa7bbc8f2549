import { randomBytes } from 'node:crypto'
import { setTimeout as sleep } from 'node:timers/promises'
import t from 'tap'
import { build } from '../helper.js'
import { fromAbuser, p99 } from '../support/abuse.js'
import { rosterReads } from '../support/bystander.js'

// HEAD on an attachment answers GET's headers without reading the file: Fastify's own HEAD
// route ran the GET handler and read the whole stream to throw it away, after the download's
// place was given back (one key: 20 s of CPU in 30 s; a bystander's p99 57 → 1,093 ms).
const ENV = { RATE_LIMIT_PER_SECOND: '100000', DAILY_MESSAGE_QUOTA: '100000' }
const SIZE = 20 * 1024 * 1024

const cpuMs = (): number => {
  const { user, system } = process.cpuUsage()
  return (user + system) / 1000
}

t.test('HEAD on a 20 MiB attachment answers GET\'s headers and reads no byte of it, even 8 at a time for 4 s', async (t) => {
  const { app, as } = await build(t, { env: ENV })
  const mallory = await as('mallory')
  const carol = await as('carol')
  await as('bob')
  const base = await app.listen({ host: '127.0.0.1', port: 0 })
  const form = new FormData()
  form.append('recipient', 'bob')
  form.append('attachment', new Blob([new Uint8Array(randomBytes(SIZE))], { type: 'image/png' }), 'big "picture".png')
  const sent = await fetch(`${base}/v2/message`, { method: 'POST', headers: { authorization: mallory.authorization }, body: form })
  t.equal(sent.status, 200)
  const url = `${base}/v2/message/${(await sent.json() as { id: string }).id}/attachment/1`
  const authorization = mallory.authorization

  // What a download costs this process, to compare.
  let cpu = cpuMs()
  const got = await fetch(url, { headers: { authorization } })
  t.equal((await got.arrayBuffer()).byteLength, SIZE)
  const getCpuMs = cpuMs() - cpu

  const head = await fetch(url, { method: 'HEAD', headers: { authorization } })
  t.equal(head.status, 200)
  for (const name of ['content-length', 'etag', 'accept-ranges', 'content-type', 'content-disposition', 'cache-control', 'x-content-type-options']) {
    t.equal(head.headers.get(name), got.headers.get(name), `HEAD answers GET's ${name}`)
  }
  t.equal(head.headers.get('content-length'), String(SIZE))
  const ranged = await fetch(url, { method: 'HEAD', headers: { authorization, range: 'bytes=100-199' } })
  t.equal(ranged.status, 206)
  t.equal(ranged.headers.get('content-range'), `bytes 100-199/${SIZE}`)
  t.equal(ranged.headers.get('content-length'), '100')
  const cached = await fetch(url, { method: 'HEAD', headers: { authorization, 'if-none-match': got.headers.get('etag')! } })
  t.equal(cached.status, 304)
  t.equal((await fetch(url.replace(/1$/, '2'), { method: 'HEAD', headers: { authorization } })).status, 404)
  t.equal((await fetch(url, { method: 'HEAD', headers: { authorization: carol.authorization } })).status, 403, 'same access as GET')

  cpu = cpuMs()
  const alone = await rosterReads(base, carol.authorization, 40)
  const aloneP99 = p99(alone.map((r) => r.ms))
  // The bystander's own cost (its client is in this process too), taken out of the HEADs'.
  const perReadMs = (cpuMs() - cpu) / alone.length
  cpu = cpuMs()
  const flood = fromAbuser<{ heads: number, statuses: Record<string, number> }>(`
    const [url, authorization] = process.argv.slice(1)
    const until = Date.now() + 4000
    const statuses = {}
    let heads = 0
    Promise.all(Array.from({ length: 8 }, async () => {
      while (Date.now() < until) {
        const res = await fetch(url, { method: 'HEAD', headers: { authorization } })
        await res.arrayBuffer()
        heads++
        statuses[res.status] = (statuses[res.status] ?? 0) + 1
      }
    })).then(() => process.stdout.write(JSON.stringify({ heads, statuses })))
  `, [url, authorization])
  const loaded = await rosterReads(base, carol.authorization, flood)
  const { heads, statuses } = await flood
  // Anything a HEAD left reading in the background would still be running: let it show.
  await sleep(1_000)
  const perHeadMs = Math.max(0, cpuMs() - cpu - perReadMs * loaded.length) / heads
  const loadedP99 = p99(loaded.map((r) => r.ms))
  const bound = Math.max(5 * aloneP99, 250)
  t.comment(`${heads} HEADs: ${perHeadMs.toFixed(2)} ms of this process's CPU each, a GET ${getCpuMs.toFixed(0)} ms (a roster read ${perReadMs.toFixed(2)} ms)`)
  t.comment(`roster p99 alone ${aloneP99.toFixed(0)} ms, under the HEADs ${loadedP99.toFixed(0)} ms over ${loaded.length} reads (bound ${bound.toFixed(0)} ms)`)
  t.same(statuses, { 200: heads }, 'every HEAD answered 200')
  t.ok(heads >= 40, 'the flood went on')
  t.ok(perHeadMs < Math.max(5, getCpuMs / 10), 'a HEAD costs a small fraction of a download: it reads no byte')
  t.same([...new Set(loaded.map((r) => r.status))], [200], 'every roster read answered 200')
  t.ok(loadedP99 < bound, `roster p99 ${loadedP99.toFixed(0)} ms < ${bound.toFixed(0)} ms`)
  t.ok(loadedP99 < 2_000, 'and under the hard ceiling of 2 s')
})
