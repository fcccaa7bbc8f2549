import { connect, type Socket } from 'node:net'
import { setTimeout as sleep } from 'node:timers/promises'
import { sql } from 'drizzle-orm'
import t, { type Test } from 'tap'
import { queryRows } from '../../src/db/rows.js'
import { build } from '../helper.js'
import { fromAbuser, p99 } from '../support/abuse.js'
import { rosterReads } from '../support/bystander.js'
import { until } from '../support/until.js'

// Clients that hang up: a place at admission is held until the handler's work is done, not
// until the socket closes, and a request whose client left before its turn does nothing.
// Both databases: the held places were the pool's on PostgreSQL, the one connection on PGlite.
const ENV = { RATE_LIMIT_PER_SECOND: '100000', DAILY_MESSAGE_QUOTA: '100000' }

/** Gauges from /metrics: `parley_admission{gate,state}`. */
async function admission (base: string): Promise<Record<string, number>> {
  const text = await (await fetch(`${base}/metrics`)).text()
  const out: Record<string, number> = {}
  for (const [, gate, state, value] of text.matchAll(/^parley_admission\{gate="(\w+)",state="(\w+)"\} (\d+)/gm)) out[`${gate}.${state}`] = Number(value)
  return out
}

/**
 * Requests from /metrics that are over: sends written, and errors answered (by code), each
 * counted once whether or not a client was left to answer. A send whose client hung up ends
 * in one or the other: written, or refused RATE_LIMITED (abandoned before its turn).
 */
async function finished (base: string): Promise<{ sent: number, errors: Record<string, number> }> {
  const text = await (await fetch(`${base}/metrics`)).text()
  const errors: Record<string, number> = {}
  for (const [, code, value] of text.matchAll(/^parley_errors_total\{code="(\w+)"\} (\d+)$/gm)) errors[code!] = Number(value)
  return { sent: Number(/^parley_messages_sent_total (\d+)$/m.exec(text)?.[1] ?? 0), errors }
}
const total = (counts: Record<string, number>): number => Object.values(counts).reduce((sum, n) => sum + n, 0)

t.test('a key renaming a 1,000-member group and hanging up after 150 ms, 12 at a time for 4 s, beside a bystander\'s roster reads', async (t) => {
  const { app, db, database, as } = await build(t, { env: ENV })
  const mallory = await as('mallory')
  const carol = await as('carol')
  const base = await app.listen({ host: '127.0.0.1', port: 0 })
  await db.execute(sql`INSERT INTO users (address) SELECT 'member' || g FROM generate_series(1, 999) g`)
  const created = await fetch(`${base}/v2/group`, {
    method: 'POST',
    headers: { authorization: mallory.authorization, 'content-type': 'application/json' },
    body: JSON.stringify({ name: 'everyone', members: Array.from({ length: 999 }, (_, i) => `member${i + 1}`) })
  })
  t.equal(created.status, 200)
  const group = (await created.json() as { id: string }).id
  const renameOnce = async () => {
    const started = performance.now()
    const res = await fetch(`${base}/v2/group/${group}`, {
      method: 'POST', headers: { authorization: mallory.authorization, 'content-type': 'application/json' }, body: JSON.stringify({ name: 'warm' })
    })
    await res.arrayBuffer()
    return performance.now() - started
  }
  const warm: number[] = []
  for (let i = 0; i < 5; i++) warm.push(await renameOnce())
  const renameMs = Math.max(...warm)
  const fastestRename = Math.min(...warm)

  const alone = await rosterReads(base, carol.authorization, 40)
  const aloneP99 = p99(alone.map((r) => r.ms))

  // Samples while the abuse runs: places held by the heavy gate, and (PostgreSQL) pool connections in use.
  const samples: { heavy: number, inUse: number }[] = []
  const abuse = fromAbuser<{ started: number, answered: Record<string, number> }>(`
    const http = require('node:http')
    const [base, authorization, group] = process.argv.slice(1)
    const until = Date.now() + 4000
    const answered = {}
    let started = 0
    const once = (i) => new Promise((resolve) => {
      started++
      const body = JSON.stringify({ name: 'renamed ' + i })
      const req = http.request(base + '/v2/group/' + group, {
        method: 'POST', agent: false,
        headers: { authorization, 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) }
      }, (res) => { answered[res.statusCode] = (answered[res.statusCode] ?? 0) + 1; res.resume() })
      req.on('error', () => {})
      req.on('close', resolve)
      req.end(body)
      setTimeout(() => { req.destroy(); resolve() }, 150)
    })
    Promise.all(Array.from({ length: 12 }, async (_, loop) => {
      for (let i = 0; Date.now() < until; i++) await once(loop * 10000 + i)
    })).then(() => process.stdout.write(JSON.stringify({ started, answered })))
  `, [base, mallory.authorization, group])
  const sampling = (async () => {
    let over = false
    void abuse.finally(() => { over = true })
    while (!over) {
      const stats = database.stats()
      samples.push({ heavy: (await admission(base))['heavy.held'] ?? 0, inUse: stats.total - stats.idle })
      await sleep(50)
    }
  })()
  const abuseStarted = performance.now()
  const loaded = await rosterReads(base, carol.authorization, abuse)
  const sent = await abuse
  const abuseMs = performance.now() - abuseStarted
  await sampling
  const loadedP99 = p99(loaded.map((r) => r.ms))

  // A roster read may wait for the one rename in flight (on the embedded database it holds the
  // one connection; a rename of 1,000 members is 150-300 ms here), never for a backlog of them
  // (the abuser's twelve: twelve renames). A read that comes just after a rename began waits
  // for it, and then for the event loop while the next rename builds its 999 events (84-205 ms
  // on the embedded database, BENCHMARKS.md "Connected clients"): CI saw 382 ms beside renames
  // of 153 ms alone, one heavy place held at most; and 321 ms beside renames of 79 ms alone
  // (2026-11-28, a faster machine, where the abuser's own process slows each rename too). Five
  // renames' time still tells one in flight from a backlog (the abuser's twelve).
  const bound = Math.max(5 * aloneP99, 250, 5 * renameMs)
  t.comment(`${sent.started} renames hung up (answered before 150 ms: ${JSON.stringify(sent.answered)}); a rename alone ${renameMs.toFixed(0)} ms`)
  t.comment(`roster p99 alone ${aloneP99.toFixed(0)} ms, under the hang-ups ${loadedP99.toFixed(0)} ms over ${loaded.length} reads (bound ${bound.toFixed(0)} ms)`)
  t.comment(`heavy places held at most ${Math.max(...samples.map((s) => s.heavy))}, database connections in use at most ${Math.max(...samples.map((s) => s.inUse))}`)
  t.ok(sent.started >= 50, 'the abuser hung up on many renames')
  t.ok(loaded.length >= 10, `the bystander read its roster ${loaded.length} times meanwhile`)
  t.same([...new Set(loaded.map((r) => r.status))], [200], 'every roster read answered 200')
  t.ok(loadedP99 < bound, `roster p99 ${loadedP99.toFixed(0)} ms < ${bound.toFixed(0)} ms`)
  t.ok(loadedP99 < 5_000, 'and under the hard ceiling of 5 s')
  t.same(Object.keys(sent.answered).filter((s) => Number(s) >= 500), [], 'no 5xx to the abuser either')
  t.ok(samples.every((s) => s.heavy <= 1), 'one key never holds more than its one heavy place')
  // Once the abuse ends, every place is given back, and no hung-up rename is left to run: the
  // renames carried out (one group.updated each in a member's feed) are what one place allows
  // in the time, not the hundreds the abuser started (before: each one ran, after its client left).
  await until(async () => Object.entries(await admission(base)).every(([, n]) => n === 0), { message: 'no place held' })
  const renames = async () => (await queryRows<{ n: number }>(db, sql`SELECT count(*)::int AS n FROM events WHERE address = 'member1' AND type = 'group.updated'`))[0]!.n
  let carriedOut = await renames()
  // Something that must not happen (a hung-up rename still on its way to the gate, then
  // carried out): the count unchanged over a second, however many seconds that takes.
  await until(async () => {
    await sleep(1_000)
    const now = await renames()
    const settled = now === carriedOut
    carriedOut = now
    return settled
  }, { timeoutMs: 30_000, message: 'the renames settled' })
  // Twice what the fastest rename alone allows: a warm process renames faster than it did
  // alone (CI: 33 where 23 were expected), while the fault this catches runs every one started
  // (hundreds).
  const allowed = warm.length + Math.ceil(2 * abuseMs / fastestRename) + 2
  t.comment(`${carriedOut - warm.length} renames carried out during ${abuseMs.toFixed(0)} ms of abuse (allowed ${allowed - warm.length})`)
  t.ok(carriedOut <= allowed, 'only renames whose clients were still there when their turn came were carried out')
  t.equal(await renameOnce() < 5_000, true, 'the abuser\'s own renames still go')
})

/** Opens a socket and writes one whole HTTP request on it; resolves once written. */
function rawRequest (base: string, method: string, path: string, headers: Record<string, string>, body: string): Promise<Socket> {
  const { hostname, port } = new URL(base)
  return new Promise((resolve, reject) => {
    const socket = connect(Number(port), hostname, () => {
      const head = [`${method} ${path} HTTP/1.1`, `Host: ${hostname}`, ...Object.entries(headers).map(([k, v]) => `${k}: ${v}`), `Content-Length: ${Buffer.byteLength(body)}`]
      socket.write(`${head.join('\r\n')}\r\n\r\n${body}`, () => resolve(socket))
    })
    socket.on('error', reject)
  })
}

/** A listening server where mallory has sent bob one message: her key is known and her quota row exists. */
async function listeningWithWarmSender (t: Test) {
  const { app, db, as } = await build(t, { env: ENV })
  const mallory = await as('mallory')
  await as('bob')
  const base = await app.listen({ host: '127.0.0.1', port: 0 })
  const warm = await fetch(`${base}/v2/message`, {
    method: 'POST', headers: { authorization: mallory.authorization, 'content-type': 'application/json' }, body: JSON.stringify({ recipient: 'bob', body: 'warm' })
  })
  t.equal(warm.status, 200, 'the key is known and its quota row exists')
  return { db, base, mallory }
}

t.test('30 sends whose clients close their sockets as soon as the request is written are not sent', async (t) => {
  const { db, base, mallory } = await listeningWithWarmSender(t)
  const headers = { Authorization: mallory.authorization, 'Content-Type': 'application/json' }
  // Written whole, then closed (a FIN: Node aborts the request, and no answer can reach it).
  const sockets = await Promise.all(Array.from({ length: 30 }, (_, i) =>
    rawRequest(base, 'POST', '/v2/message', headers, JSON.stringify({ recipient: 'bob', body: `gone ${i}` }))))
  for (const socket of sockets) socket.destroy()
  // Each of the 30 over (written, or refused as abandoned), beside the warm-up's send.
  await until(async () => {
    const { sent, errors } = await finished(base)
    return sent + total(errors) >= 31
  }, { message: 'every send over' })
  await until(async () => Object.entries(await admission(base)).every(([, n]) => n === 0), { message: 'no place held' })
  const bodies = await queryRows<{ body: string }>(db, sql`SELECT body FROM messages WHERE sender = 'mallory' AND body LIKE 'gone %'`)
  t.comment(`${bodies.length} of 30 written (before: 30 of 30)`)
  // One whose close reached the server only after its work began may be written: ack after commit.
  t.ok(bodies.length < 5, 'sends whose clients had gone before their turn were not written')
  t.equal(new Set(bodies.map((r) => r.body)).size, bodies.length, 'each at most once')
})

t.test('30 sends whose clients hang up while they wait their turn are never written; those admitted are written once', async (t) => {
  const { db, base, mallory } = await listeningWithWarmSender(t)

  // The key's sends stall on its quota row (on PGlite every query stalls behind this
  // transaction), so the first few are admitted and wait in the database, the rest at the gate.
  let release!: () => void
  const released = new Promise<void>((resolve) => { release = resolve })
  let locked!: () => void
  const isLocked = new Promise<void>((resolve) => { locked = resolve })
  const holder = db.transaction(async (tx) => {
    await tx.execute(sql`SELECT 1 FROM quota_usage WHERE key_id = ${mallory.keyId} FOR UPDATE`)
    locked()
    await released
  })
  await isLocked

  const headers = { Authorization: mallory.authorization, 'Content-Type': 'application/json' }
  const sockets = await Promise.all(Array.from({ length: 30 }, (_, i) =>
    rawRequest(base, 'POST', '/v2/message', headers, JSON.stringify({ recipient: 'bob', body: `hung up ${i}` }))))
  let admitted = 0
  await until(async () => {
    const gauges = await admission(base)
    admitted = gauges['request.held'] ?? 0
    return admitted + (gauges['request.waiting'] ?? 0) === 30 && admitted > 0
  }, { message: '30 sends admitted or waiting' })
  for (const socket of sockets) socket.resetAndDestroy()
  // Each of the 30 either refused as abandoned, or holding a place (stalled on the row): so
  // anything wrongly let in by the hang-ups has started too. Then the database is free again.
  await until(async () => {
    const [{ errors }, gauges] = await Promise.all([finished(base), admission(base)])
    return gauges['request.waiting'] === 0 && (errors.RATE_LIMITED ?? 0) + (gauges['request.held'] ?? 0) === 30
  }, { message: 'the waiting sends abandoned, the admitted ones stalled' })
  release()
  await holder
  await until(async () => {
    const { sent, errors } = await finished(base)
    return sent + total(errors) >= 31 && (await admission(base))['request.held'] === 0
  }, { message: 'the admitted sends done' })

  const bodies = await queryRows<{ body: string }>(db, sql`SELECT body FROM messages WHERE sender = 'mallory' AND body LIKE 'hung up %'`)
  t.comment(`${admitted} admitted before the hang-ups, ${bodies.length} written`)
  t.ok(bodies.length <= admitted, `only sends admitted before their clients left were written (${bodies.length} <= ${admitted})`)
  t.equal(new Set(bodies.map((r) => r.body)).size, bodies.length, 'each at most once')
  const after = await fetch(`${base}/v2/message`, {
    method: 'POST', headers: { authorization: mallory.authorization, 'content-type': 'application/json' }, body: JSON.stringify({ recipient: 'bob', body: 'after' })
  })
  t.equal(after.status, 200, 'the key sends again afterwards')
})
