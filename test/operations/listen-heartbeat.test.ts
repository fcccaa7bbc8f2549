import { createServer, connect, type AddressInfo, type Socket } from 'node:net'
import { Writable } from 'node:stream'
import t from 'tap'
import { buildApp } from '../../src/app.js'
import { connectPostgres } from '../../src/db/client.js'
import { build, testConfig } from '../helper.js'
import { usingPostgres } from '../support/databases.js'
import { longPollsWaiting } from '../support/metrics.js'
import { until } from '../support/until.js'

const skip = usingPostgres() ? false : 'the LISTEN connection is a PostgreSQL connection'
const HEARTBEAT_MS = 300

interface Pair { client: Socket, server: Socket, sent: string, dead: boolean, closed: boolean }

/**
 * A TCP proxy in front of PostgreSQL that can turn the connection that LISTENs half-open:
 * its traffic is dropped both ways while both sockets stay open, as when a middlebox forgets
 * a flow. Connections made afterwards (and the pool's) pass as before.
 */
async function startProxy (target: { host: string, port: number }) {
  const pairs: Pair[] = []
  const server = createServer((client) => {
    const upstream = connect(target.port, target.host)
    const pair: Pair = { client, server: upstream, sent: '', dead: false, closed: false }
    pairs.push(pair)
    client.on('data', (chunk) => {
      if (pair.sent.length < 100_000) pair.sent += chunk.toString('latin1')
      if (!pair.dead) upstream.write(chunk)
    })
    upstream.on('data', (chunk) => { if (!pair.dead) client.write(chunk) })
    const close = () => {
      pair.closed = true
      client.destroy()
      upstream.destroy()
    }
    client.on('close', close)
    upstream.on('close', close)
    client.on('error', () => {})
    upstream.on('error', () => {})
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const listening = () => pairs.filter((p) => !p.closed && p.sent.includes('LISTEN '))
  return {
    port: (server.address() as AddressInfo).port,
    listening,
    /** Black-holes the connections that LISTEN now; answers them. */
    blackHoleListeners (): Pair[] {
      const hit = listening()
      for (const p of hit) p.dead = true
      return hit
    },
    async close () {
      for (const p of pairs) { p.client.destroy(); p.server.destroy() }
      await new Promise((resolve) => server.close(resolve))
    }
  }
}

t.test('a half-open LISTEN connection is noticed by its heartbeat and replaced; cross-instance wake-ups resume', { skip }, async (t) => {
  const built = await build(t, { env: { RATE_LIMIT_PER_SECOND: '100000' } })
  const url = new URL(built.url!)
  const proxy = await startProxy({ host: url.hostname, port: Number(url.port) })
  t.teardown(() => proxy.close())
  const viaProxy = new URL(built.url!)
  viaProxy.port = String(proxy.port)
  const database = await connectPostgres(viaProxy.toString(), 3, { listenHeartbeatMs: HEARTBEAT_MS })
  const quiet = new Writable({ write (_chunk, _encoding, done) { done() } })
  const other = await buildApp({ config: testConfig({ RATE_LIMIT_PER_SECOND: '100000' }), database, logStream: quiet })
  t.teardown(async () => {
    await other.close()
    await database.close()
  })
  await other.ready()
  const alice = await built.as('alice')
  const bob = await built.as('bob')

  /** A long-poll on the proxied instance, woken by a send through the direct one. */
  const wakeUp = async (body: string): Promise<{ ms: number, bodies: string[] }> => {
    const last = (await other.inject({ method: 'GET', url: '/v2/events?limit=200', headers: { authorization: bob.authorization } })).json().last as string
    const poll = other.inject({ method: 'GET', url: `/v2/events?after=${last}&wait=8`, headers: { authorization: bob.authorization } })
    await until(async () => await longPollsWaiting(other) === 1, { message: 'the long-poll waiting on the proxied instance' })
    const sentAt = Date.now()
    t.equal((await alice.post('/v2/message', { recipient: 'bob', body })).statusCode, 200)
    const page = (await poll).json() as { events: { data: { message?: { body: string } } }[] }
    return { ms: Date.now() - sentAt, bodies: page.events.map((e) => e.data.message?.body ?? '') }
  }

  const before = await wakeUp('before')
  t.same(before.bodies, ['before'])
  t.ok(before.ms < 2_000, `woken across instances in ${before.ms} ms`)

  const [dead] = proxy.blackHoleListeners()
  t.ok(dead, 'the proxied instance LISTENs through the proxy')
  const blackHoled = Date.now()
  await until(() => dead!.closed, { timeoutMs: 20 * HEARTBEAT_MS, intervalMs: 20, message: 'the instance drops the half-open connection' })
  t.ok(true, `dropped after ${Date.now() - blackHoled} ms (heartbeat ${HEARTBEAT_MS} ms)`)
  await until(() => proxy.listening().some((p) => !p.dead), { intervalMs: 20, message: 'the instance LISTENs again' })

  const after = await wakeUp('after')
  t.same(after.bodies, ['after'])
  t.ok(after.ms < 2_000, `woken across instances again in ${after.ms} ms`)
})
