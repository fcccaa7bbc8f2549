import pg from 'pg'
import t, { type Test } from 'tap'
import type { Database, OwnListening } from '../../../src/db/client.js'
import { announceGrowth, announceToOwnListeners, EVENTS_CHANNEL, onAnnounceError, settleAnnouncements } from '../../../src/modules/events/announcements.repository.js'
import { freshDatabase, usingPostgres } from '../../support/databases.js'
import { until } from '../../support/until.js'

// The announcer's own rules while its process is alone on its database
// (announcements.repository.ts, Alone), on a real database and with listeners of the test's
// own, so that what each announcement became is seen: handed over, or NOTIFYd.
const onlyPostgres = usingPostgres() ? false : 'the embedded database always announces with NOTIFY'

/** Listeners that record what they are handed, and refuse a payload naming `refuse`. */
function ownListeners (refuse?: string) {
  const handed: string[] = []
  const joined = new Set<() => void>()
  const listening: OwnListening = {
    name: `parley listener test-${process.pid}-${Math.random().toString(16).slice(2)}`,
    deliver (channel, payload) {
      if (channel !== EVENTS_CHANNEL) throw new Error(`handed on ${channel}`)
      if (refuse !== undefined && payload.split(',').includes(refuse)) throw new Error(`${refuse} cannot be heard`)
      handed.push(payload)
    },
    onJoined (fn) {
      joined.add(fn)
      return () => { joined.delete(fn) }
    }
  }
  return { listening, handed, joined }
}

interface Setup {
  database: Database
  url: string
  handed: string[]
  joined: Set<() => void>
  counted: string[]
  errors: number[]
  clock: { now: number }
  stop: () => void
}

async function setUp (t: Test, refuse?: string): Promise<Setup> {
  const fresh = await freshDatabase()
  t.teardown(() => fresh.drop())
  const own = ownListeners(refuse)
  const database: Database = { ...fresh.database, listening: own.listening }
  const counted: string[] = []
  const errors: number[] = []
  const clock = { now: 0 }
  onAnnounceError(database.db, (_err, addresses) => { errors.push(addresses) })
  const stop = announceToOwnListeners(database, (via) => { counted.push(via) }, () => clock.now)
  t.teardown(stop)
  return { database, url: fresh.url!, handed: own.handed, joined: own.joined, counted, errors, clock, stop }
}

/**
 * Announces `address` until an announcement is handed to the own listeners (a look found the
 * announcer alone), then waits for the announcer to be idle.
 */
async function untilAlone (s: Setup, address = 'warming'): Promise<void> {
  const owned = () => s.counted.filter((via) => via === 'own').length
  const before = owned()
  await until(() => {
    announceGrowth(s.database.db, [address])
    return owned() > before
  }, { intervalMs: 20, message: 'the announcer never found itself alone' })
  await settleAnnouncements(s.database.db)
}

t.test('a payload the own listeners cannot take costs its own addresses, not the rest of the batch\'s', { skip: onlyPostgres }, async (t) => {
  const s = await setUp(t, 'a150')
  await untilAlone(s)
  const owned = s.counted.filter((via) => via === 'own').length
  // 250 addresses: three payloads (100 a payload, sorted), the second naming the refused one.
  const addresses = Array.from({ length: 250 }, (_, i) => `a${String(i).padStart(3, '0')}`)
  announceGrowth(s.database.db, addresses)
  await until(() => s.errors.length > 0, { message: 'the refused payload was never reported' })
  await until(() => s.handed.some((payload) => payload.split(',').includes('a249')), { message: 'the last payload was never handed over' })
  t.same(s.errors, [100], 'one failure, of the refused payload\'s 100 addresses')
  const heard = new Set(s.handed.flatMap((payload) => payload.split(',')))
  t.ok(addresses.slice(0, 100).every((a) => heard.has(a)), 'the payload before it was handed over')
  t.ok(addresses.slice(200).every((a) => heard.has(a)), 'and the one after it')
  t.notOk(heard.has('a150'), 'the refused one was not')
  t.equal(s.counted.filter((via) => via === 'own').length, owned, 'a batch that lost a payload is not counted as told')
})

t.test('a look that fails means NOTIFY: nothing more is handed over until a look answers', { skip: onlyPostgres }, async (t) => {
  const s = await setUp(t)
  await untilAlone(s)
  const name = new URL(s.url).pathname.slice(1)
  const admin = new pg.Client({ connectionString: process.env.DATABASE_URL })
  await admin.connect()
  t.teardown(async () => {
    await admin.query(`ALTER DATABASE "${name}" ALLOW_CONNECTIONS true`)
    await admin.end()
  })
  // The database stops taking connections, and the pool's are ended: every statement fails.
  await admin.query(`ALTER DATABASE "${name}" ALLOW_CONNECTIONS false`)
  await admin.query('SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1', [name])
  await until(async () => {
    try {
      await s.database.ping()
      return false
    } catch {
      return true
    }
  }, { message: 'the database still answered' })

  // Past the last look's trust: this announcement is a NOTIFY, and starts a look, which fails.
  s.clock.now = 1_500
  const errorsBefore = s.errors.length
  // From then on (the look failed within these), no announcement is handed over: not alone.
  for (const address of ['after-1', 'after-2', 'after-3']) {
    const errors = s.errors.length
    announceGrowth(s.database.db, [address])
    await until(() => s.errors.length > errors, { message: `${address} was not tried as a NOTIFY` })
  }
  const heard = new Set(s.handed.flatMap((payload) => payload.split(',')))
  t.notOk(['after-1', 'after-2', 'after-3'].some((a) => heard.has(a)), 'no announcement after the failed look was handed to the own listeners')
  t.ok(s.errors.length - errorsBefore >= 3, 'each was a NOTIFY, which failed and was reported')

  // Connections again: a look answers, and announcements are handed over once more.
  await admin.query(`ALTER DATABASE "${name}" ALLOW_CONNECTIONS true`)
  s.clock.now = 3_000
  await untilAlone(s, 'back')
  t.ok(s.handed.some((payload) => payload.split(',').includes('back')), 'handed over again once a look found it alone')
})

t.test('once stopped, the announcer NOTIFYs and no longer hears of newcomers', { skip: onlyPostgres }, async (t) => {
  const s = await setUp(t)
  await untilAlone(s)
  t.equal(s.joined.size, 1, 'it hears of newcomers while it tells its own listeners')
  s.stop()
  t.equal(s.joined.size, 0, 'and stops hearing when stopped')

  const listener = new pg.Client({ connectionString: s.url })
  await listener.connect()
  t.teardown(() => listener.end())
  const notified: string[] = []
  listener.on('notification', (msg) => { notified.push(...(msg.payload ?? '').split(',')) })
  await listener.query(`LISTEN ${EVENTS_CHANNEL}`)
  const handed = s.handed.length
  announceGrowth(s.database.db, ['stopped'])
  await until(() => notified.includes('stopped'), { message: 'the announcement was never NOTIFYd' })
  t.equal(s.handed.length, handed, 'nothing more was handed to the own listeners')
})
