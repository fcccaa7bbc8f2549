import { sql } from 'drizzle-orm'
import t from 'tap'
import { queryRows } from '../../../src/db/rows.js'
import { build } from '../../helper.js'

// The quota's day is the database's, not the instance's: two instances whose clocks disagree
// around midnight must count against the same day, and X-Quota-Reset must say when that day
// ends. Here this process's clock runs three days ahead of the database's. On PostgreSQL the
// database keeps its own clock; the embedded database may read this process's clock, where the
// two agree and the test shows only that the headers and the count agree with the database.
const SHIFT_MS = 3 * 24 * 3600_000

t.test('the quota day and X-Quota-Reset come from the database\'s clock', async (t) => {
  const { as, db } = await build(t)
  const alice = await as('alice', { dailyQuota: 2 })
  await as('bob')
  const RealDate = Date
  class ShiftedDate extends RealDate {
    constructor (...args: unknown[]) {
      if (args.length === 0) super(RealDate.now() + SHIFT_MS)
      else super(...(args as [string]))
    }

    static override now (): number { return RealDate.now() + SHIFT_MS }
  }
  globalThis.Date = ShiftedDate as DateConstructor
  t.teardown(() => { globalThis.Date = RealDate })

  const first = await alice.post('/v2/message', { recipient: 'bob', body: 'one' }, { headers: { 'idempotency-key': 'k1' } })
  t.equal(first.statusCode, 200)
  const [clock] = await queryRows<{ day: string, reset: string }>(db, sql`
    SELECT to_char((now() AT TIME ZONE 'UTC')::date, 'YYYY-MM-DD') AS day,
      extract(epoch FROM date_trunc('day', now() AT TIME ZONE 'UTC') + interval '1 day')::bigint::text AS reset`)
  const rows = await queryRows<{ day: string, count: number }>(db, sql`SELECT to_char(day, 'YYYY-MM-DD') AS day, count FROM quota_usage WHERE key_id = ${alice.keyId}`)
  t.same(rows, [{ day: clock!.day, count: 1 }], `counted against the database's day, ${clock!.day}`)
  t.equal(first.headers['x-quota-reset'], clock!.reset, 'X-Quota-Reset: the end of the database\'s day')
  t.equal(first.headers['x-quota-remaining'], '1')

  const replayed = await alice.post('/v2/message', { recipient: 'bob', body: 'one' }, { headers: { 'idempotency-key': 'k1' } })
  t.equal(replayed.statusCode, 200)
  t.equal(replayed.json().id, first.json().id, 'a replay answers the same message')
  t.equal(replayed.headers['x-quota-reset'], clock!.reset, 'and the same reset')
  t.equal(replayed.headers['x-quota-remaining'], '1', 'and the same count')

  t.equal((await alice.post('/v2/message', { recipient: 'bob', body: 'two' })).statusCode, 200)
  const refused = await alice.post('/v2/message', { recipient: 'bob', body: 'three' })
  t.equal(refused.statusCode, 429)
  t.equal(refused.headers['x-quota-reset'], clock!.reset, 'a refusal names the same reset')
})
