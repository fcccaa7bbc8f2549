import t from 'tap'

/**
 * Two instances behind one pooler nobody declared share server connections, and with them the
 * statements each prepared: a name must mean one statement text in every process, whatever
 * order each process met its statements in. Two copies of the module stand for two processes.
 */
t.test('a statement\'s name is the same in every process, whatever order they named statements in', async (t) => {
  const here = await import('../../src/db/rows.js')
  const copy = new URL('../../src/db/rows.js?another-process', import.meta.url).href
  const there = await import(copy) as typeof here
  t.not(here, there, 'two copies of the module')
  const texts = ['SELECT pg_try_advisory_xact_lock($1)', 'SELECT id FROM groups WHERE id = ANY($1::text[]) FOR SHARE', 'SELECT 1']
  const namedHere = texts.map((text) => here.statementName(text))
  const namedThere = [...texts].reverse().map((text) => there.statementName(text)).reverse()
  t.same(namedThere, namedHere)
  t.equal(new Set(namedHere).size, texts.length, 'each text its own name')
  for (const name of namedHere) t.ok(name.length <= 63, `${name} fits PostgreSQL's identifier length`)
})
