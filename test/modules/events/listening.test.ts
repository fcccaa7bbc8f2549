import t from 'tap'
import pg from 'pg'
import { purgeExpired } from '../../../src/modules/retention/retention.js'
import { build } from '../../helper.js'
import { usingPostgres } from '../../support/databases.js'
import { metric } from '../../support/metrics.js'
import { until } from '../../support/until.js'

const onlyPostgres = usingPostgres() ? false : 'connection counts and cross-connection locks need PostgreSQL'

t.test('30 waiting long-polls hold no database connection; a send still goes through', { skip: onlyPostgres }, async (t) => {
  const { app, as, url } = await build(t, { env: { RATE_LIMIT_PER_SECOND: '1000' } })
  const alice = await as('alice')
  const readers = await Promise.all(Array.from({ length: 30 }, (_, i) => as(`r${i}`)))
  const polls = readers.map((r) => r.get('/v2/events?wait=10'))
  await until(async () => await metric(app, 'parley_long_polls_open') === 30, { message: 'the 30 long-polls never all waited' })

  const admin = new pg.Client({ connectionString: url })
  await admin.connect()
  t.teardown(() => admin.end())
  const { rows } = await admin.query<{ n: number }>(
    'SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()')
  // The app's pool (at most 5 in tests) plus its one LISTEN connection, however many polls wait.
  t.ok(rows[0]!.n <= 6, `${rows[0]!.n} connections for 30 waiting polls`)
  const { rows: listening } = await admin.query<{ n: number }>(
    "SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE 'parley listener %'")
  t.equal(listening[0]!.n, 1, 'one LISTEN connection')

  const sent = await alice.post('/v2/message', { recipient: 'r7', body: 'you' })
  t.equal(sent.statusCode, 200)
  const answers = await Promise.all(polls)
  t.match(answers[7]!.json(), { events: [{ data: { message: { body: 'you' } } }] })
  t.same(answers[0]!.json(), { events: [], last: '0' })
})

t.test('retention runs on one instance at a time', { skip: onlyPostgres }, async (t) => {
  const { db, url } = await build(t)
  const other = new pg.Client({ connectionString: url })
  await other.connect()
  t.teardown(() => other.end())
  await other.query('BEGIN')
  await other.query('SELECT pg_advisory_xact_lock($1)', [0x70726574])
  t.same(await purgeExpired(db), { ran: false, events: 0, auditEntries: 0, messages: 0 }, 'skipped while another sweep holds the lock')
  await other.query('COMMIT')
  t.match(await purgeExpired(db), { ran: true })
})
