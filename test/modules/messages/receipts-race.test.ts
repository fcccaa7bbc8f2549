import t from 'tap'
import { build } from '../../helper.js'

t.test('reading a status while the sender deletes the message answers 200 or 404, never 500', async (t) => {
  const { as } = await build(t, { env: { RATE_LIMIT_PER_SECOND: '100000', DAILY_MESSAGE_QUOTA: '100000' } })
  const alice = await as('alice')
  const bob = await as('bob')
  const seen = new Map<number, number>()
  for (let i = 0; i < 40; i++) {
    const id = (await alice.post('/v2/message', { recipient: 'bob', body: `m${i}` })).json().id
    // Several reads around the delete, so some land between the access check and the read.
    const reads = Array.from({ length: 4 }, () => bob.get(`/v2/message/${id}/status`))
    const [deleted, ...statuses] = await Promise.all([alice.delete(`/v2/message/${id}`), ...reads])
    t.equal(deleted!.statusCode, 204)
    for (const r of statuses) {
      seen.set(r.statusCode, (seen.get(r.statusCode) ?? 0) + 1)
      if (r.statusCode === 404) t.match(r.json(), { statusCode: 404, code: 'NOT_FOUND', message: new RegExp(id) })
    }
  }
  t.same([...seen.keys()].filter((s) => s !== 200 && s !== 404), [], `only 200 and 404 (${JSON.stringify([...seen])})`)
})
