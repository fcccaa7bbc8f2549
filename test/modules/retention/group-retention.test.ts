import t from 'tap'
import { purgeExpired } from '../../../src/modules/retention/retention.js'
import { build } from '../../helper.js'
import { age, holdOffAppSweeps } from './support.js'

t.test('POST /v2/group/:id sets retentionDays for the owner only; 400 names the field; GET and whoami say what applies', async (t) => {
  const { as, db } = await build(t, { env: { MESSAGE_RETENTION_DAYS: '90' } })
  await holdOffAppSweeps(db)
  const alice = await as('alice')
  const bob = await as('bob')
  const mallory = await as('mallory')
  const created = (await alice.post('/v2/group', { name: 'ops', members: ['bob'] })).json()
  t.match(created, { retentionDays: null, effectiveRetentionDays: 90 }, 'a new group: the service\'s 90 days apply')
  const id = created.id as string
  t.match((await alice.get('/v2/whoami')).json(), { retentionDays: 90 }, 'whoami: the service\'s retention')

  const set = await alice.post(`/v2/group/${id}`, { retentionDays: 30 })
  t.equal(set.statusCode, 200)
  t.match(set.json(), { id, name: 'ops', retentionDays: 30, effectiveRetentionDays: 30 })
  t.match((await bob.get(`/v2/group/${id}`)).json(), { retentionDays: 30, effectiveRetentionDays: 30 }, 'members read it')
  const told = (await bob.get('/v2/events')).json().events as { type: string, data: { group: { id: string } } }[]
  t.ok(told.some((e) => e.type === 'group.updated' && e.data.group.id === id), 'members get group.updated')

  const longer = await alice.post(`/v2/group/${id}`, { retentionDays: 365 }, { format: 'form' })
  t.equal(longer.statusCode, 200, 'a form body: the number is coerced')
  t.match(longer.json(), { retentionDays: 365, effectiveRetentionDays: 90 }, 'longer than the service\'s: the shorter applies')

  const renamed = await alice.post(`/v2/group/${id}`, { name: 'operations' })
  t.match(renamed.json(), { name: 'operations', retentionDays: 365 }, 'a rename leaves the retention alone')
  const both = await alice.post(`/v2/group/${id}`, { name: 'ops', retentionDays: 7 })
  t.match(both.json(), { name: 'ops', retentionDays: 7, effectiveRetentionDays: 7 })

  const byMember = await bob.post(`/v2/group/${id}`, { retentionDays: 1 })
  t.equal(byMember.statusCode, 403, 'a member who is not the owner may not')
  t.match(byMember.json(), { code: 'FORBIDDEN', message: /owner/ })
  t.equal((await mallory.post(`/v2/group/${id}`, { retentionDays: 1 })).statusCode, 403, 'nor may a stranger')
  for (const bad of [0, 36_501, 1.5, -3, 'soon', false]) {
    const res = await alice.post(`/v2/group/${id}`, { retentionDays: bad })
    t.equal(res.statusCode, 400, `retentionDays ${JSON.stringify(bad)}`)
    t.match(res.json(), { code: 'VALIDATION_FAILED', message: /retentionDays/ }, 'the message names the field')
  }
  const empty = await alice.post(`/v2/group/${id}`, {})
  t.equal(empty.statusCode, 400)
  t.match(empty.json(), { code: 'VALIDATION_FAILED', message: /name.*retentionDays/ })
  t.match((await alice.get(`/v2/group/${id}`)).json(), { retentionDays: 7 }, 'refused changes changed nothing')

  const cleared = await alice.post(`/v2/group/${id}`, { retentionDays: null })
  t.match(cleared.json(), { retentionDays: null, effectiveRetentionDays: 90 }, 'null clears it')
  const found = (await alice.post('/v2/search', { query: 'ops', types: ['groups'] })).json().results
  t.match(found, [{ type: 'group', group: { id, retentionDays: null, effectiveRetentionDays: 90 } }], 'search answers the same group')
})

t.test('without MESSAGE_RETENTION_DAYS: whoami says null, and a group\'s own retention is what applies', async (t) => {
  const { as } = await build(t)
  const alice = await as('alice')
  t.match((await alice.get('/v2/whoami')).json(), { retentionDays: null })
  const id = (await alice.post('/v2/group', { name: 'ops' })).json().id as string
  t.match((await alice.get(`/v2/group/${id}`)).json(), { retentionDays: null, effectiveRetentionDays: null })
  t.match((await alice.post(`/v2/group/${id}`, { retentionDays: 14 })).json(), { retentionDays: 14, effectiveRetentionDays: 14 })
})

t.test('a group\'s shorter retention purges that group\'s messages only; the shorter of the two always applies', async (t) => {
  const { as, db } = await build(t, { env: { MESSAGE_RETENTION_DAYS: '90', RATE_LIMIT_PER_SECOND: '100000' } })
  await holdOffAppSweeps(db)
  const alice = await as('alice')
  const bob = await as('bob')
  const short = (await alice.post('/v2/group', { name: 'short', members: ['bob'] })).json().id as string
  const plain = (await alice.post('/v2/group', { name: 'plain', members: ['bob'] })).json().id as string
  const long = (await alice.post('/v2/group', { name: 'long', members: ['bob'] })).json().id as string
  t.equal((await alice.post(`/v2/group/${short}`, { retentionDays: 7 })).statusCode, 200)
  t.equal((await alice.post(`/v2/group/${long}`, { retentionDays: 365 })).statusCode, 200)

  const send = async (recipient: string, body: string, days: number) => {
    const id = (await alice.post('/v2/message', { recipient, body })).json().id as string
    await age(db, [id], days)
    return id
  }
  const gone = [await send(short, 'short ten', 10), await send(short, 'short hundred', 100), await send(long, 'long hundred', 100), await send('bob', 'direct hundred', 100)]
  const kept = [await send(short, 'short three', 3), await send(plain, 'plain ten', 10), await send(long, 'long ten', 10), await send('bob', 'direct ten', 10), await send(plain, 'plain eighty', 80)]

  t.match(await purgeExpired(db, 0, 365, { messageRetentionDays: 90 }), { ran: true, messages: gone.length })
  for (const id of gone) t.equal((await bob.get(`/v2/message/${id}`)).statusCode, 404, `${id} purged`)
  for (const id of kept) t.equal((await bob.get(`/v2/message/${id}`)).statusCode, 200, `${id} kept`)

  const eightDays = await send(short, 'short eight', 8)
  const ancient = await send(plain, 'plain ancient', 1000)
  t.match(await purgeExpired(db, 0, 365, {}), { ran: true, messages: 1 }, 'with no service retention, the group\'s own still applies')
  t.equal((await bob.get(`/v2/message/${eightDays}`)).statusCode, 404, 'past its 7 days')
  t.equal((await bob.get(`/v2/message/${ancient}`)).statusCode, 200, 'a group without its own keeps everything')
  for (const id of kept) t.equal((await bob.get(`/v2/message/${id}`)).statusCode, 200)
})
