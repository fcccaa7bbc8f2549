import { sql } from 'drizzle-orm'
import t from 'tap'
import { openDatabase } from '../../src/db/client.js'
import { queryRows } from '../../src/db/rows.js'
import { childDatabaseEnv, runCliInProcess, startServer } from '../support/processes.js'
import { startReceiver, validSignature } from '../support/webhook-receiver.js'

/**
 * Webhook delivery survives a crash: a server is SIGKILLed while it sends a feed to a webhook,
 * and started again. Every event reaches the receiver once the dead server's lease runs out
 * (30 s at most; the test moves it to now, as if those seconds had passed); an event sent twice
 * is the same event, with the same id and body.
 */
t.test('a SIGKILL mid-delivery loses no event; a repeat carries the same id and body', async (t) => {
  const env: Record<string, string> = { ...await childDatabaseEnv(t), WEBHOOK_ALLOW_PRIVATE: 'true', RATE_LIMIT_PER_SECOND: '100000' }
  const auth: Record<string, string> = {}
  for (const address of ['alice', 'bob']) {
    t.equal((await runCliInProcess(['user', 'create', address], env)).code, 0)
    const key = JSON.parse((await runCliInProcess(['key', 'create', address, '--json', '--daily-quota', '100000'], env)).stdout) as { keyId: string, secret: string }
    auth[address] = `Basic ${Buffer.from(`${key.keyId}:${key.secret}`).toString('base64')}`
  }
  // 20 ms an event: the sends are done long before the deliveries, and the kill lands mid-stream.
  const receiver = await startReceiver(t, () => 200, 20)
  const first = await startServer(t, env)
  const call = async (base: string, who: string, method: string, path: string, body?: unknown) => {
    const res = await fetch(`${base}${path}`, {
      method, headers: { authorization: auth[who]!, ...(body !== undefined ? { 'content-type': 'application/json' } : {}) }, body: body === undefined ? undefined : JSON.stringify(body)
    })
    return { status: res.status, json: await res.json() as Record<string, unknown> }
  }
  const hook = (await call(first.url, 'alice', 'POST', '/v2/webhooks', { url: receiver.url })).json as { id: string, secret: string }
  t.match(hook, { id: /^whk_/ })

  const SENDS = 300
  for (let i = 0; i < SENDS; i += 20) {
    const statuses = await Promise.all(Array.from({ length: 20 }, (_, j) => call(first.url, 'bob', 'POST', '/v2/message', { recipient: 'alice', body: `m${i + j}` }).then((r) => r.status)))
    t.same([...new Set(statuses)], [200], `sends ${i}-${i + 19}`)
  }
  const before = receiver.received.length
  first.child.kill('SIGKILL')
  await new Promise((resolve) => first.child.once('exit', resolve))
  t.ok(before < SENDS, `killed after ${before} of ${SENDS} deliveries`)
  // The 30 s the dead holder's lease has left pass at once; the restarted server's claim then
  // takes the webhook over, as any instance would after a crash.
  const database = await openDatabase({ databaseUrl: env.DATABASE_URL, dataDir: env.DATA_DIR ?? '', command: 'test', poolSize: 1 })
  try {
    const leased = await queryRows<{ id: string }>(database.db, sql`UPDATE webhooks SET lease_until = now() WHERE lease_until > now() RETURNING id`)
    t.equal(leased.length, 1, 'the killed server held the webhook\'s lease')
  } finally {
    await database.close()
  }

  const second = await startServer(t, env)
  const feed: string[] = []
  for (let after = '0'; ;) {
    const page = (await call(second.url, 'alice', 'GET', `/v2/events?after=${after}&limit=1000`)).json as { events: { id: string }[], last: string }
    if (page.events.length === 0) break
    feed.push(...page.events.map((e) => e.id))
    after = page.last
  }
  t.equal(feed.length, SENDS, 'alice\'s feed holds every message')
  await receiver.until(() => new Set(receiver.received.map((r) => r.event.id)).size >= SENDS, 90_000)
  const ids = receiver.received.map((r) => r.event.id)
  t.same([...new Set(ids)].sort((a, b) => Number(a) - Number(b)), feed, 'every event arrived')
  const bodies = new Map<string, Set<string>>()
  for (const r of receiver.received) bodies.set(r.event.id, (bodies.get(r.event.id) ?? new Set()).add(r.body))
  t.ok([...bodies.values()].every((set) => set.size === 1), `a repeat is the same event (${ids.length - new Set(ids).size} repeated)`)
  t.ok(receiver.received.every((r) => validSignature(hook.secret, r.headers['x-parley-signature'], r.body)), 'every delivery is signed')
  // In order, apart from the repeats after the restart: each id is at least the last one before it or a repeat.
  const firstSeen = [...new Set(ids)]
  t.same(firstSeen, [...firstSeen].sort((a, b) => Number(a) - Number(b)), 'first deliveries in id order')
  await second.stop()
})
