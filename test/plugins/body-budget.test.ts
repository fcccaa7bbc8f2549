import t from 'tap'
import { formFieldsOver, jsonValuesOver } from '../../src/plugins/body-budget.js'
import { build } from '../helper.js'

t.test('jsonValuesOver counts values outside strings only, and stops at the limit', async (t) => {
  t.equal(jsonValuesOver('{"a":[1,2,3]}', 4), false, 'an opening { and [ and two commas: four')
  t.equal(jsonValuesOver('{"a":[1,2,3,4]}', 4), true)
  t.equal(jsonValuesOver(JSON.stringify({ body: ',,,,[[[{{{'.repeat(1000) }), 3), false, 'commas and brackets inside a string do not count')
  t.equal(jsonValuesOver(JSON.stringify({ body: 'say \\"hi\\", [then] "go", ok\\\\' }), 1), false, 'escaped quotes and backslashes do not end a string early')
  t.equal(jsonValuesOver(JSON.stringify({ body: 'x\\', a: [1, 2, 3] }), 3), true, 'a string ending in a backslash ends where it should')
  t.equal(jsonValuesOver('{"a": "never closed, [1,2,3]', 1), false, 'an unterminated string is left to JSON.parse')
  t.equal(jsonValuesOver(JSON.stringify({ a: new Array(499_000).fill(0) }), 20_000), true)
  t.equal(formFieldsOver('a=1&b=2&c=3', 3), false)
  t.equal(formFieldsOver('a=1&b=2&c=3&d=4', 3), true)
  t.equal(formFieldsOver('', 1), false)
})

t.test('a body of more values than any request needs is refused before it is parsed', async (t) => {
  const { as } = await build(t)
  const alice = await as('alice')
  await as('bob')
  const wide = await alice.post('/v2/message', { recipient: 'bob', body: 'x', padding: new Array(25_000).fill(0) })
  t.equal(wide.statusCode, 400)
  t.match(wide.json(), { code: 'VALIDATION_FAILED', message: 'body: more than 20000 values; no request needs that many' })
  const form = await alice.post('/v2/message', { recipient: 'bob', body: 'x', padding: new Array(25_000).fill('0') }, { format: 'form' })
  t.equal(form.statusCode, 400)
  t.match(form.json(), { code: 'VALIDATION_FAILED', message: /body: more than 20000 values/ })
  t.equal((await alice.get('/v2/events')).json().events.length, 0, 'nothing was sent')
  t.equal((await alice.post('/v2/message', { recipient: 'bob', body: 'x'.repeat(10_000).replace(/x/g, ',') })).statusCode, 200, 'a long body of commas is one value')
  t.equal((await alice.post('/v2/message', { recipient: 'bob', body: 'ok', padding: new Array(1000).fill(0) })).statusCode, 200, 'a thousand unknown values are ignored as before')
})

t.test('the largest legitimate body passes: a group of 1,000 members (999 named) in one request', async (t) => {
  const { as, createUser } = await build(t)
  const alice = await as('alice')
  const members = Array.from({ length: 999 }, (_, i) => `member-${i}-${'x'.repeat(50)}`)
  for (let i = 0; i < members.length; i += 200) await Promise.all(members.slice(i, i + 200).map((m) => createUser(m)))
  const made = await alice.post('/v2/group', { name: 'big', members })
  t.equal(made.statusCode, 200, made.body.slice(0, 200))
  t.equal(made.json().members.length, 1000)
})
