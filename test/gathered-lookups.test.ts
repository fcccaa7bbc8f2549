import t from 'tap'
import { createGatheredLookups } from '../src/gathered-lookups.js'

/** A look-up of squares, recording each statement's ids; it answers after a turn, as a database does. */
function squares () {
  const statements: string[][] = []
  const findMany = async (ids: string[]) => {
    statements.push(ids)
    await new Promise((resolve) => setImmediate(resolve))
    return new Map(ids.filter((id) => id !== 'none').map((id) => [id, Number(id) ** 2]))
  }
  return { statements, findMany }
}

t.test('ids asked for in one turn go out together, a statement at most perStatement of them, each answered its own', async (t) => {
  const { statements, findMany } = squares()
  const find = createGatheredLookups(findMany, 4)
  const answers = await Promise.all(['1', '2', '3', '4', '5', '6', 'none'].map(find))
  t.same(answers, [1, 4, 9, 16, 25, 36, undefined], 'each its own row, a missing id undefined')
  t.same(statements, [['1', '2', '3', '4'], ['5', '6', 'none']], 'two statements for seven ids')
})

t.test('an id on its way is not asked for again; once answered, it is', async (t) => {
  const { statements, findMany } = squares()
  const find = createGatheredLookups(findMany, 100)
  const first = find('7')
  await new Promise((resolve) => setImmediate(resolve))
  t.same(statements, [['7']], 'the statement went out')
  const second = find('7')
  t.equal(second, first, 'asked for again while the statement runs: the same answer')
  t.same(await Promise.all([first, second, find('7')]), [49, 49, 49])
  t.same(statements, [['7']], 'one statement')
  t.equal(await find('7'), 49)
  t.same(statements, [['7'], ['7']], 'after the answer, a new look-up asks again (the caller caches)')
})

t.test('a failed statement fails every look-up it carried, and only those', async (t) => {
  let calls = 0
  const find = createGatheredLookups(async (ids: string[]) => {
    calls++
    if (calls === 1) throw new Error('connection lost')
    return new Map(ids.map((id) => [id, id]))
  }, 100)
  const failed = await Promise.allSettled([find('a'), find('b')])
  t.same(failed.map((r) => r.status), ['rejected', 'rejected'])
  t.same(await find('a'), 'a', 'the next look-up of the same id asks again')
})
