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
  const lookups = createGatheredLookups(findMany, 4)
  const answers = await Promise.all(['1', '2', '3', '4', '5', '6', 'none'].map((id) => lookups.find(id)))
  t.same(answers, [1, 4, 9, 16, 25, 36, undefined], 'each its own row, a missing id undefined')
  t.same(statements, [['1', '2', '3', '4'], ['5', '6', 'none']], 'two statements for seven ids')
})

t.test('an id on its way is not asked for again; once answered, or after reset, it is', async (t) => {
  const { statements, findMany } = squares()
  const lookups = createGatheredLookups(findMany, 100)
  const first = lookups.find('7')
  await new Promise((resolve) => setImmediate(resolve))
  t.same(statements, [['7']], 'the statement went out')
  const second = lookups.find('7')
  t.equal(second, first, 'asked for again while the statement runs: the same answer')
  t.same(await Promise.all([first, second, lookups.find('7')]), [49, 49, 49])
  t.same(statements, [['7']], 'one statement')
  t.equal(await lookups.find('7'), 49)
  t.same(statements, [['7'], ['7']], 'after the answer, a new look-up asks again (the caller caches)')
  const before = lookups.find('8')
  lookups.reset()
  const after = lookups.find('8')
  t.not(after, before, 'after reset, a look-up of its own')
  t.same(await Promise.all([before, after]), [64, 64], 'both answered, though asked for in the same turn')
})

t.test('a statement that does not answer is shared for a second, then later askers get their own', async (t) => {
  const statements: string[][] = []
  let clock = 0
  const lookups = createGatheredLookups(async (ids: string[]) => {
    statements.push(ids)
    // The first never answers (a connection gone half-open); later ones do.
    if (statements.length === 1) return new Promise<Map<string, string>>(() => {})
    return new Map(ids.map((id) => [id, `row ${id}`]))
  }, 100, () => clock)
  const hung = lookups.find('a')
  await new Promise((resolve) => setImmediate(resolve))
  clock += 999
  t.equal(lookups.find('a'), hung, 'shared within the second')
  clock += 1
  t.equal(await lookups.find('a'), 'row a', 'a second later: a statement of its own, answered')
  t.same(statements, [['a'], ['a']])
})

t.test('a failed statement fails every look-up it carried, and only those', async (t) => {
  let calls = 0
  const lookups = createGatheredLookups(async (ids: string[]) => {
    calls++
    if (calls === 1) throw new Error('connection lost')
    return new Map(ids.map((id) => [id, id]))
  }, 2)
  const settled = await Promise.allSettled(['a', 'b', 'c'].map((id) => lookups.find(id)))
  t.same(settled.map((r) => r.status), ['rejected', 'rejected', 'fulfilled'], 'the first statement (a, b) failed, the second (c) answered')
  t.same(await lookups.find('a'), 'a', 'the next look-up of the same id asks again')
  const throwing = createGatheredLookups((): Promise<Map<string, string>> => { throw new Error('thrown, not rejected') }, 2)
  await t.rejects(throwing.find('x'), /thrown, not rejected/, 'a look-up that throws at once still fails its callers')
})
