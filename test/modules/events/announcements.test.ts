import { sql } from 'drizzle-orm'
import t from 'tap'
import { connectPostgres, type Database } from '../../../src/db/client.js'
import { queryRows } from '../../../src/db/rows.js'
import { transaction } from '../../../src/db/transaction.js'
import { announceGrowth, EVENTS_CHANNEL, onAnnounceError } from '../../../src/modules/events/announcements.repository.js'
import { createEventsRepository } from '../../../src/modules/events/events.repository.js'
import { build, type TestContext } from '../../helper.js'
import { usingPostgres } from '../../support/databases.js'
import { until } from '../../support/until.js'

/** Every address announced on `database`'s channel, as heard. */
async function hearing (t: TestContext, database: Database): Promise<string[]> {
  const heard: string[] = []
  const stop = await database.listen(EVENTS_CHANNEL, (payload) => { heard.push(...payload.split(',')) })
  t.teardown(stop)
  return heard
}

const deleted = (address: string, message: string) => ({ address, type: 'message.deleted' as const, data: { message } })

t.test('feeds that grew are announced once their transaction commits, and never when it rolls back', async (t) => {
  const { database, db, as, createUser } = await build(t)
  for (const address of ['ann', 'bea', 'cy']) await createUser(address)
  const heard = await hearing(t, database)

  await t.rejects(transaction(db, async (tx) => {
    await createEventsRepository(tx).append([deleted('ann', 'm1')])
    throw new Error('the work failed')
  }))
  await transaction(db, async (tx) => {
    await createEventsRepository(tx).append([deleted('bea', 'm2'), deleted('cy', 'm3'), deleted('bea', 'm4')])
  })
  await until(() => heard.includes('bea') && heard.includes('cy'), { message: 'bea and cy announced' })

  // A send's batch statement announces its recipients' feeds once it has committed.
  const alice = await as('alice')
  t.equal((await alice.post('/v2/message', { recipient: 'cy', body: 'hello' })).statusCode, 200)
  await until(() => heard.filter((a) => a === 'cy').length === 2, { message: 'cy announced again' })
  t.notOk(heard.includes('ann'), 'the rolled-back append was never announced')
  const [rows] = await queryRows<{ n: number }>(db, sql`SELECT count(*)::int AS n FROM events WHERE address = 'ann'`)
  t.equal(rows!.n, 0, 'and wrote nothing')
})

t.test('writers on a slow disk do not commit one at a time: announcing holds no lock across a writer\'s flush', { skip: usingPostgres() ? false : 'the embedded database has one connection and no flush to wait for' }, async (t) => {
  const { url, database, db, createUser } = await build(t)
  const writers = 8
  const addresses = Array.from({ length: writers }, (_, i) => `w${i}`)
  for (const address of addresses) await createUser(address)
  const heard = await hearing(t, database)
  // A slow disk, for this database only: every flush at commit waits DELAY_MS first
  // (commit_siblings 0: whatever else runs; a superuser's settings, as the suite's role is, and
  // only with fsync on). PostgreSQL's group commit still flushes together the commits that wait
  // at the same time; NOTIFY's lock, held across a notifying writer's flush, would let only one
  // through at a time (8 flushes, 8 waits: 411 ms with 50 ms before the change, 57 after).
  const DELAY_MS = 100
  const name = new URL(url!).pathname.slice(1)
  await db.execute(sql.raw(`ALTER DATABASE "${name}" SET commit_delay = ${DELAY_MS * 1000}`))
  await db.execute(sql.raw(`ALTER DATABASE "${name}" SET commit_siblings = 0`))
  const slow = await connectPostgres(url!, writers + 2)
  t.teardown(() => slow.close())
  const append = (address: string, n: number) => transaction(slow.db, async (tx) => {
    await createEventsRepository(tx).append([deleted(address, `m${n}`)])
  })

  // Warm: each connection of the pool opened, its statements prepared.
  await Promise.all(addresses.map((a) => append(a, 0)))
  await until(() => addresses.every((a) => heard.includes(a)), { message: 'every writer\'s feed announced' })
  // One writer alone, three times: its commit, and how long after it its feed is announced (the
  // announcement's own commit waits for no flush, so well within one).
  const alone: number[] = []
  const announced: number[] = []
  for (let n = 1; n <= 3; n++) {
    heard.length = 0
    const started = performance.now()
    await append('w0', n)
    const committed = performance.now()
    alone.push(committed - started)
    await until(() => heard.includes('w0'), { intervalMs: 1, message: 'w0 announced' })
    announced.push(performance.now() - committed)
  }
  const median = (values: number[]) => [...values].sort((x, y) => x - y)[Math.floor(values.length / 2)]!
  heard.length = 0
  const started = performance.now()
  await Promise.all(addresses.map((a) => append(a, 9)))
  const together = performance.now() - started
  t.comment(`one writer ${alone.map((ms) => ms.toFixed(0)).join(' / ')} ms, announced ${announced.map((ms) => ms.toFixed(0)).join(' / ')} ms after; ${writers} at once ${together.toFixed(0)} ms`)
  t.ok(median(alone) >= DELAY_MS * 0.9, `a commit waits for its slow flush (${median(alone).toFixed(0)} ms; fsync must be on)`)
  t.ok(median(announced) < DELAY_MS, `its feed is announced ${median(announced).toFixed(0)} ms after it commits: the announcement waits for no flush`)
  t.ok(together < median(alone) * writers / 2, `${writers} writers at once took ${together.toFixed(0)} ms: under ${writers / 2}x one alone (${median(alone).toFixed(0)} ms), not one flush after another`)
  await until(() => addresses.every((a) => heard.includes(a)), { message: 'every writer\'s feed announced' })
})

t.test('an announcement that fails is reported, and the next ones still go out', async (t) => {
  const { database, db, createUser } = await build(t)
  for (const address of ['fay', 'gus']) await createUser(address)
  const heard = await hearing(t, database)
  // The real database, whose next announcement fails as a lost connection would, once the test
  // lets it: the next feed grows while it hangs, so the same run of announcements must go on.
  let failures = 1
  let fail!: () => void
  const failing = new Promise<void>((resolve) => { fail = resolve })
  let hanging = false
  const session = new Proxy(db._.session, {
    get (target, prop, receiver) {
      if (prop !== 'prepareQuery') return Reflect.get(target, prop, receiver) as unknown
      return (...args: Parameters<typeof target.prepareQuery>) => {
        const prepared = target.prepareQuery(...args)
        if (!args[0].sql.includes('pg_notify') || failures === 0) return prepared
        failures--
        return {
          ...prepared,
          execute: async () => {
            hanging = true
            await failing
            throw new Error('Connection terminated unexpectedly')
          }
        }
      }
    }
  })
  const flaky = new Proxy(db, {
    get (target, prop, receiver) {
      if (prop === '_') return { ...target._, session }
      return Reflect.get(target, prop, receiver) as unknown
    }
  })
  const reported: { message: string, feeds: number }[] = []
  onAnnounceError(flaky, (err, feeds) => { reported.push({ message: (err as Error).message, feeds }) })

  announceGrowth(flaky, ['fay'])
  await until(() => hanging, { message: 'the first announcement under way' })
  announceGrowth(flaky, ['gus'])
  fail()
  await until(() => reported.length === 1, { message: 'the failure reported' })
  t.same(reported, [{ message: 'Connection terminated unexpectedly', feeds: 1 }], 'the failure is reported with how many feeds it concerned')
  await until(() => heard.includes('gus'), { message: 'gus announced' })
  t.notOk(heard.includes('fay'), 'the failed one was not heard (its waiters re-read on their own)')
  t.equal(reported.length, 1, 'and nothing else failed')
})
