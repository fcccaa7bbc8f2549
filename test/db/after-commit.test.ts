import { sql } from 'drizzle-orm'
import t from 'tap'
import { afterCommit, transaction, transactionOnce } from '../../src/db/transaction.js'
import { freshDatabase } from '../support/databases.js'

t.test('afterCommit runs once what it follows has committed, and never for what rolled back', async (t) => {
  const fresh = await freshDatabase()
  t.teardown(() => fresh.drop())
  const db = fresh.database.db
  const ran: string[] = []
  const note = (label: string) => () => { ran.push(label) }

  afterCommit(db, note('outside a transaction'))
  t.same(ran, ['outside a transaction'], 'on the database itself (its statement committed on its own): at once')
  ran.length = 0

  const result = await transaction(db, async (tx) => {
    afterCommit(tx, note('committed'))
    t.same(ran, [], 'not before the commit')
    return 42
  })
  t.equal(result, 42, 'the transaction\'s result is its work\'s')
  t.same(ran, ['committed'], 'after the commit')
  ran.length = 0

  await t.rejects(transaction(db, async (tx) => {
    afterCommit(tx, note('rolled back'))
    throw new Error('the work failed')
  }), /the work failed/)
  t.same(ran, [], 'a transaction rolled back runs none')

  await transaction(db, async (tx) => {
    afterCommit(tx, note('outer'))
    await transaction(tx, async (savepoint) => { afterCommit(savepoint, note('savepoint released')) })
    await transaction(tx, async (savepoint) => {
      afterCommit(savepoint, note('savepoint rolled back'))
      throw new Error('the savepoint\'s work failed')
    }).catch(() => {})
    t.same(ran, [], 'a savepoint released hands its hooks to its transaction, not yet run')
  })
  t.same(ran, ['outer', 'savepoint released'], 'the transaction\'s and its released savepoint\'s run, in order; the one rolled back to does not')
  ran.length = 0

  // A deadlock victim is run again whole: only the run that committed counts.
  let runs = 0
  await transaction(db, async (tx) => {
    runs++
    afterCommit(tx, note(`run ${runs}`))
    if (runs === 1) throw Object.assign(new Error('deadlock detected'), { code: '40P01' })
  })
  t.equal(runs, 2, 'the transaction ran again')
  t.same(ran, ['run 2'], 'only the hooks of the run that committed')
  ran.length = 0

  await transactionOnce(db, async (tx) => { afterCommit(tx, note('one try')) })
  t.same(ran, ['one try'], 'a transaction of one try runs them too')
  ran.length = 0

  // A transaction begun elsewhere has no way to run them: a mistake, refused where it is made.
  await t.rejects(db.transaction(async (tx) => {
    await tx.execute(sql`SELECT 1`)
    afterCommit(tx, note('foreign'))
  }), /not begun by db\/transaction.ts/)
  t.same(ran, [], 'nothing ran for it')
  await t.rejects(db.transaction(async (tx) => {
    await transaction(tx, async (savepoint) => { afterCommit(savepoint, note('foreign savepoint')) })
  }), /not begun by db\/transaction.ts/, 'nor a savepoint of one')
  t.same(ran, [], 'nothing ran for that either')
})
