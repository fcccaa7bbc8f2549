import { setTimeout as sleep } from 'node:timers/promises'
import { sql } from 'drizzle-orm'
import t from 'tap'
import { queryRows } from '../../src/db/rows.js'
import { bystander, p99, relativeBound, watchStalls } from '../support/bystander.js'
import { usingPostgres } from '../support/databases.js'
import { build, type Built, type Caller } from '../helper.js'
import { createReactionFanoutsRepository, FANOUT_CHUNK } from '../../src/modules/messages/reaction-fanouts.repository.js'
import { tellLeftFanouts } from '../../src/modules/messages/reactions.service.js'

const THUMBS = encodeURIComponent('👍')
const HEART = encodeURIComponent('❤️')

interface Event { type: string, data: Record<string, unknown> }

async function feed (caller: Caller, type: string): Promise<Event[]> {
  return ((await caller.get('/v2/events?limit=1000')).json().events as Event[]).filter((e) => e.type === type)
}

async function reactions (caller: Caller, id: string): Promise<unknown> {
  return (await caller.get(`/v2/message/${id}`)).json().reactions
}

t.test('reactions: added and taken back idempotently, counted most used first, mine per reader, told to the others', async (t) => {
  const { as } = await build(t)
  const alice = await as('alice')
  const bob = await as('bob')
  const carol = await as('carol')
  const dave = await as('dave')
  const group = (await alice.post('/v2/group', { name: 'ops', members: ['bob', 'carol', 'dave'] })).json().id as string
  const id = (await alice.post('/v2/message', { recipient: group, body: 'ship it?' })).json().id as string
  t.same(await reactions(alice, id), [])
  // Dave hid it: he hears of no reaction.
  t.equal((await dave.delete(`/v2/message/${id}`)).statusCode, 204)

  t.equal((await bob.put(`/v2/message/${id}/reactions/${HEART}`)).statusCode, 204)
  t.equal((await bob.put(`/v2/message/${id}/reactions/${THUMBS}`)).statusCode, 204)
  t.equal((await carol.put(`/v2/message/${id}/reactions/${THUMBS}`)).statusCode, 204)
  t.equal((await carol.put(`/v2/message/${id}/reactions/${THUMBS}`)).statusCode, 204, 'again: no change')
  t.same(await reactions(carol, id), [{ emoji: '👍', count: 2, mine: true }, { emoji: '❤️', count: 1, mine: false }], 'most used first')
  t.same(await reactions(alice, id), [{ emoji: '👍', count: 2, mine: false }, { emoji: '❤️', count: 1, mine: false }])
  t.same((await alice.get(`/v2/conversations/${group}/messages`)).json().messages[0].reactions, await reactions(alice, id), 'the history shows them too')

  t.same((await feed(alice, 'message.reaction')).map((e) => e.data), [
    { message: id, emoji: '❤️', from: 'bob', added: true },
    { message: id, emoji: '👍', from: 'bob', added: true },
    { message: id, emoji: '👍', from: 'carol', added: true }
  ], 'the sender hears of each change once')
  t.same((await feed(carol, 'message.reaction')).map((e) => e.data.from), ['bob', 'bob'], 'a recipient hears of the others\' only')
  t.same(await feed(dave, 'message.reaction'), [], 'not one who hid it')

  t.equal((await bob.delete(`/v2/message/${id}/reactions/${HEART}`)).statusCode, 204)
  t.equal((await bob.delete(`/v2/message/${id}/reactions/${HEART}`)).statusCode, 204, 'again: no change')
  t.same(await reactions(bob, id), [{ emoji: '👍', count: 2, mine: true }])
  t.match((await feed(alice, 'message.reaction')).at(-1), { data: { emoji: '❤️', from: 'bob', added: false } })
  t.equal((await feed(alice, 'message.reaction')).length, 4)

  // An edit's event carries the reactions as each recipient sees them.
  t.equal((await alice.patch(`/v2/message/${id}`, { body: 'ship it!' })).statusCode, 200)
  t.same((await feed(bob, 'message.edited'))[0]!.data, { message: { ...(await bob.get(`/v2/message/${id}`)).json() } })
  t.same(((await feed(carol, 'message.edited'))[0]!.data.message as { reactions: unknown }).reactions, [{ emoji: '👍', count: 2, mine: true }])
})

t.test('reactions: emoji checked, 20 different ones at most, only for readers, gone with the message', async (t) => {
  const { as, db } = await build(t, { env: { RATE_LIMIT_PER_SECOND: '100000' } })
  const alice = await as('alice')
  const bob = await as('bob')
  const carol = await as('carol')
  const id = (await alice.post('/v2/message', { recipient: 'bob', body: 'pick one' })).json().id as string
  for (const [emoji, status] of [['a b', 400], ['%0A', 400], ['x'.repeat(33), 400], ['x'.repeat(32), 204], ['%C2%A0', 400], ['🏳️‍🌈', 204]] as const) {
    const res = await bob.put(`/v2/message/${id}/reactions/${emoji.startsWith('%') ? emoji : encodeURIComponent(emoji)}`)
    t.equal(res.statusCode, status, `emoji ${JSON.stringify(emoji)}`)
    if (status === 400) t.match(res.json().message, /emoji/)
  }
  for (let i = 0; i < 18; i++) t.equal((await bob.put(`/v2/message/${id}/reactions/e${i}`)).statusCode, 204)
  const full = await alice.put(`/v2/message/${id}/reactions/one-more`)
  t.equal(full.statusCode, 409)
  t.match(full.json(), { code: 'CONFLICT', message: /already has 20 different reactions/ })
  t.equal((await alice.put(`/v2/message/${id}/reactions/e0`)).statusCode, 204, 'one of the twenty still goes')
  t.equal(((await reactions(alice, id)) as unknown[]).length, 20)

  t.equal((await carol.put(`/v2/message/${id}/reactions/${THUMBS}`)).statusCode, 403, 'a stranger')
  t.equal((await bob.put(`/v2/message/msg_${'0'.repeat(26)}/reactions/${THUMBS}`)).statusCode, 404)
  t.equal((await bob.delete(`/v2/message/${id}`)).statusCode, 204)
  t.equal((await bob.put(`/v2/message/${id}/reactions/${THUMBS}`)).statusCode, 404, 'hidden by bob')
  t.equal((await alice.delete(`/v2/message/${id}`)).statusCode, 204)
  const left = await queryRows<{ n: number }>(db, sql`SELECT count(*)::int AS n FROM message_reactions`)
  t.equal(left[0]!.n, 0, 'reactions go with the message')
})

t.test('50 members react at once, with the same emoji and their own: the counts are exact', async (t) => {
  const { as } = await build(t, { env: { RATE_LIMIT_PER_SECOND: '100000' } })
  const owner = await as('owner')
  const members: Caller[] = []
  for (let i = 0; i < 50; i++) members.push(await as(`m${i}`))
  const group = (await owner.post('/v2/group', { name: 'crowd', members: members.map((m) => m.address) })).json().id as string
  const id = (await owner.post('/v2/message', { recipient: group, body: 'vote' })).json().id as string
  const statuses = await Promise.all(members.flatMap((m, i) => [
    m.put(`/v2/message/${id}/reactions/${THUMBS}`).then((r) => r.statusCode),
    m.put(`/v2/message/${id}/reactions/${i % 10}`).then((r) => r.statusCode)
  ]))
  t.same([...new Set(statuses)], [204])
  const counted = await reactions(owner, id) as { emoji: string, count: number }[]
  t.same(counted[0], { emoji: '👍', count: 50, mine: false })
  t.same(counted.slice(1).map((r) => r.count), Array(10).fill(5), 'ten more, five each')
  t.equal((await feed(owner, 'message.reaction')).length, 100, 'the sender heard of every one')
})

t.test('25 readers each adding a new emoji at once: exactly 20 kinds go, the rest are 409', async (t) => {
  const { as, db } = await build(t, { env: { RATE_LIMIT_PER_SECOND: '100000' } })
  const owner = await as('owner')
  const readers: Caller[] = []
  for (let i = 0; i < 25; i++) readers.push(await as(`r${i}`))
  const group = (await owner.post('/v2/group', { name: 'race', members: readers.map((r) => r.address) })).json().id as string
  const id = (await owner.post('/v2/message', { recipient: group, body: 'race to react' })).json().id as string
  const statuses = await Promise.all(readers.map((r, i) => r.put(`/v2/message/${id}/reactions/k${i}`).then((res) => res.statusCode)))
  t.equal(statuses.filter((s) => s === 204).length, 20, '20 added')
  t.equal(statuses.filter((s) => s === 409).length, 5, '5 refused')
  const kinds = await queryRows<{ n: number }>(db, sql`SELECT count(DISTINCT emoji)::int AS n FROM message_reactions WHERE message_id = ${id}`)
  t.equal(kinds[0]!.n, 20)
})

t.test('a key reacting as fast as it may in a 1,000-member group leaves a bystander\'s sends alone', { skip: usingPostgres() ? false : 'PostgreSQL only: the embedded database is one connection shared by every request' }, async (t) => {
  const { app, as, db } = await build(t, { env: { RATE_LIMIT_PER_SECOND: '100000', DAILY_MESSAGE_QUOTA: '100000' } })
  const mallory = await as('mallory')
  const carol = await as('carol')
  await as('bob')
  await db.execute(sql`INSERT INTO users (address) SELECT 'member' || g FROM generate_series(1, 999) g`)
  const base = await app.listen({ host: '127.0.0.1', port: 0 })
  const crowd = await fetch(`${base}/v2/group`, {
    method: 'POST',
    headers: { authorization: mallory.authorization, 'content-type': 'application/json' },
    body: JSON.stringify({ name: 'everyone', members: Array.from({ length: 999 }, (_, i) => `member${i + 1}`) })
  }).then(async (r) => r.json() as Promise<{ id: string }>)
  const id = (await mallory.post('/v2/message', { recipient: crowd.id, body: 'react to me' })).json().id as string
  for (let i = 0; i < 5; i++) await fetch(`${base}/v2/whoami`, { headers: { authorization: carol.authorization } }).then((r) => r.arrayBuffer())
  const alone = bystander(base, carol.authorization, 70)
  await sleep(1_500)
  const aloneP99 = p99((await alone.stop()).map((r) => r.ms))

  const stalls = await watchStalls(t, db)
  const watch = bystander(base, carol.authorization, 70)
  const until = performance.now() + 3_000
  const statuses: number[] = []
  // Eight at once, each toggling an emoji of its own: every answered request is a change, and
  // every change 999 events.
  await Promise.all(Array.from({ length: 8 }, async (_, w) => {
    for (let added = true; performance.now() < until; added = !added) {
      const res = await fetch(`${base}/v2/message/${id}/reactions/e${w}`, { method: added ? 'PUT' : 'DELETE', headers: { authorization: mallory.authorization } })
      statuses.push(res.status)
      if (res.status !== 204) added = !added
    }
  }))
  const loaded = await watch.stop()
  const stalled = stalls.report()
  const bound = relativeBound(aloneP99, 1_000, 5, 250)
  const measured = p99(loaded.map((r) => r.ms))
  const events = await queryRows<{ n: number }>(db, sql`SELECT count(*)::int AS n FROM events WHERE type = 'message.reaction'`)
  const slowest = loaded.reduce<(typeof loaded)[number] | undefined>((a, b) => a === undefined || b.ms > a.ms ? b : a, undefined)
  t.comment(`${statuses.filter((s) => s === 204).length} reaction changes (${events[0]!.n} events); bystander p99 ${measured.toFixed(0)} ms over ${loaded.length} sends (alone ${aloneP99.toFixed(0)} ms; slowest sent at ${slowest?.at.toISOString() ?? '-'}); ${stalled}`)
  t.ok(statuses.filter((s) => s === 204).length >= 3, 'the abuser\'s reactions go')
  t.equal(events[0]!.n, statuses.filter((s) => s === 204).length * 999, 'each change told every other member')
  t.same([...new Set(statuses)].filter((s) => s !== 204 && s !== 429), [], 'answered 204, or 429 while its one heavy place is taken')
  t.ok(loaded.length >= 5, `the bystander sent ${loaded.length} messages meanwhile`)
  t.same([...new Set(loaded.map((r) => r.status))], [200], 'every bystander send answered 200')
  t.ok(measured < bound, `bystander p99 ${measured.toFixed(0)} ms < ${bound.toFixed(0)} ms`)
})

/** A group of the caller and `size - 1` members made by SQL (member1…), and a message to it. */
async function crowd (built: Built, owner: Caller, size: number): Promise<{ group: string, id: string, members: string[] }> {
  const members = Array.from({ length: size - 1 }, (_, i) => `member${i + 1}`)
  await built.db.execute(sql`INSERT INTO users (address) SELECT unnest(${sql.param(members)}::text[]) ON CONFLICT DO NOTHING`)
  const group = (await owner.post('/v2/group', { name: 'crowd', members })).json().id as string
  const id = (await owner.post('/v2/message', { recipient: group, body: 'react to me' })).json().id as string
  return { group, id, members }
}

/** Each address's message.reaction events, oldest first, from the feeds themselves: `reactor+emoji` or `reactor-emoji`. */
async function heard (db: Built['db'], addresses: string[]): Promise<Map<string, string[]>> {
  const rows = await queryRows<{ address: string, data: { from: string, emoji: string, added: boolean } }>(db, sql`
    SELECT address, data FROM events WHERE type = 'message.reaction' AND address = ANY(${sql.param(addresses)}::text[]) ORDER BY address, seq`)
  const byAddress = new Map(addresses.map((a) => [a, [] as string[]]))
  for (const r of rows) byAddress.get(r.address)!.push(`${r.data.from}${r.data.added ? '+' : '-'}${r.data.emoji}`)
  return byAddress
}

/** The feeds whose list is not `expected(address)`, with what each holds. */
function unlike (feeds: Map<string, string[]>, expected: (address: string) => string[]): string[] {
  return [...feeds].filter(([a, list]) => list.join(' ') !== expected(a).join(' ')).map(([a, list]) => `${a}: ${list.join(' ')}`)
}

t.test(`a reaction told to more than ${FANOUT_CHUNK} readers: told in bounded transactions before the answer, once each, in the order made`, async (t) => {
  const built = await build(t, { env: { RATE_LIMIT_PER_SECOND: '100000' } })
  const owner = await built.as('owner')
  const { id, members } = await crowd(built, owner, FANOUT_CHUNK * 2 + 50)
  const reactors = [await built.as('member7'), await built.as('member8')]
  // Two reactors at once, each adding, taking back and adding again: every answer comes after its
  // fan-out, so each feed holds every change of the other reactors, in one order for all.
  await Promise.all(reactors.map(async (who) => {
    for (const [method, emoji] of [['put', 'a'], ['delete', 'a'], ['put', 'b']] as const) {
      t.equal((await who[method](`/v2/message/${id}/reactions/${emoji}`)).statusCode, 204)
    }
  }))
  const feeds = await heard(built.db, ['owner', ...members])
  const order = feeds.get('owner')!
  for (const reactor of ['member7', 'member8']) {
    t.same(order.filter((e) => e.startsWith(`${reactor}+`) || e.startsWith(`${reactor}-`)), ['+a', '-a', '+b'].map((e) => reactor + e), `${reactor}'s changes in the order made`)
  }
  t.same(unlike(feeds, (a) => order.filter((e) => !e.startsWith(`${a}+`) && !e.startsWith(`${a}-`))), [],
    `each of ${feeds.size} feeds heard every change of the others once, in the order the sender's feed did`)
  t.same(await queryRows(built.db, sql`SELECT * FROM reaction_fanouts`), [], 'nothing left queued')
  // One change's copies (one a reader: the members and the sender, the reactor aside), written by
  // as many transactions as it takes FANOUT_CHUNK feeds each.
  const [writers] = await queryRows<{ n: number }>(built.db, sql`SELECT count(DISTINCT xmin::text)::int AS n FROM events
    WHERE type = 'message.reaction' AND data->>'from' = 'member7' AND data->>'emoji' = 'a' AND data->>'added' = 'true'`)
  const transactions = Math.ceil(members.length / FANOUT_CHUNK)
  t.equal(writers!.n, transactions, `one change's ${members.length} copies written by ${transactions} transactions`)
  t.same((await reactions(owner, id) as { emoji: string, count: number }[]).map((r) => [r.emoji, r.count]), [['b', 2]])
})

t.test(`a reaction to ${FANOUT_CHUNK} readers is told in its own transaction, to ${FANOUT_CHUNK + 1} queued`, async (t) => {
  const built = await build(t)
  const owner = await built.as('owner')
  for (const [size, transactions] of [[FANOUT_CHUNK + 1, 1], [FANOUT_CHUNK + 2, 2]] as const) {
    // The owner and the members, member3 (the reactor) aside: size - 1 readers.
    const { id } = await crowd(built, owner, size)
    t.equal((await (await built.as('member3')).put(`/v2/message/${id}/reactions/z`)).statusCode, 204)
    const [writers] = await queryRows<{ n: number, copies: number }>(built.db, sql`SELECT count(DISTINCT xmin::text)::int AS n, count(*)::int AS copies
      FROM events WHERE type = 'message.reaction' AND message_id = ${id}`)
    t.same(writers, { n: transactions, copies: size - 1 }, `${size - 1} readers told by ${transactions} transaction(s)`)
  }
})

t.test(`a reaction to at most ${FANOUT_CHUNK} readers waits its turn behind a fan-out of the same message still queued`, async (t) => {
  const built = await build(t)
  const owner = await built.as('owner')
  // FANOUT_CHUNK readers for member3: told in its own transaction, but for the queue.
  const { id, members } = await crowd(built, owner, FANOUT_CHUNK + 1)
  const member3 = await built.as('member3')
  // A fan-out of member5's, begun moments ago and not yet told (its request is still at it).
  await built.db.execute(sql`INSERT INTO message_reactions (message_id, emoji, address) VALUES (${id}, 'x', 'member5')`)
  await createReactionFanoutsRepository(built.db).enqueue(id, { message: id, emoji: 'x', from: 'member5', added: true }, 'member5')
  t.equal((await member3.put(`/v2/message/${id}/reactions/y`)).statusCode, 204)
  const feeds = await heard(built.db, ['owner', ...members])
  t.same(unlike(feeds, (a) => ['member5+x', 'member3+y'].filter((e) => !e.startsWith(`${a}+`))), [], 'every feed heard member5\'s first, then member3\'s')
  t.same(await queryRows(built.db, sql`SELECT * FROM reaction_fanouts`), [], 'member3\'s request told both')
})

t.test('a fan-out left half told by a process that stopped is told to the rest, once each, by the next sweep', async (t) => {
  const built = await build(t)
  const owner = await built.as('owner')
  const { id, members } = await crowd(built, owner, FANOUT_CHUNK + 20)
  const reactor = 'member3'
  // What a reacting request leaves when its process dies after the reaction's commit and one
  // transaction of telling: the reaction, its queued event, the first FANOUT_CHUNK feeds told.
  await built.db.execute(sql`INSERT INTO message_reactions (message_id, emoji, address) VALUES (${id}, 'x', ${reactor})`)
  const fanouts = createReactionFanoutsRepository(built.db)
  await fanouts.enqueue(id, { message: id, emoji: 'x', from: reactor, added: true }, reactor)
  t.match(await fanouts.tellNext(id), { done: false }, 'one transaction told')
  const everyone = ['owner', ...members].filter((a) => a !== reactor)
  const toldFirst = [...(await heard(built.db, everyone)).values()].filter((l) => l.length === 1).length
  t.equal(toldFirst, FANOUT_CHUNK, `the first ${FANOUT_CHUNK} told`)
  t.equal(await tellLeftFanouts(built.db, built.app.log, 30_000), 0, 'a fan-out begun moments ago is left to its request')
  await built.db.execute(sql`UPDATE reaction_fanouts SET created_at = now() - interval '1 minute'`)
  t.equal(await tellLeftFanouts(built.db, built.app.log, 30_000, AbortSignal.abort()), 0, 'a sweep stopped (shutdown) tells nothing more')
  t.equal([...(await heard(built.db, everyone)).values()].filter((l) => l.length === 1).length, FANOUT_CHUNK, 'still the first only')
  t.equal(await tellLeftFanouts(built.db, built.app.log, 30_000), 1, 'one begun a minute ago is taken by the sweep')
  const feeds = await heard(built.db, [...everyone, reactor])
  t.same(unlike(feeds, (a) => a === reactor ? [] : ['member3+x']), [], 'every other reader heard it exactly once, the reactor not at all')
  t.same(await queryRows(built.db, sql`SELECT * FROM reaction_fanouts`), [], 'nothing left queued')
})

t.test('a message deleted with a fan-out still queued takes it along', async (t) => {
  const built = await build(t)
  const owner = await built.as('owner')
  const { id } = await crowd(built, owner, FANOUT_CHUNK + 20)
  const fanouts = createReactionFanoutsRepository(built.db)
  await fanouts.enqueue(id, { message: id, emoji: 'x', from: 'member3', added: true }, 'member3')
  t.equal((await owner.delete(`/v2/message/${id}`)).statusCode, 204)
  t.equal(await fanouts.tellNext(id), undefined, 'nothing left to tell')
  t.same(await queryRows(built.db, sql`SELECT * FROM reaction_fanouts`), [])
})

t.test('an event\'s data reaches every feed as written, whatever characters it holds', async (t) => {
  const { as } = await build(t)
  const alice = await as('alice')
  const bob = await as('bob')
  const carol = await as('carol')
  const group = (await alice.post('/v2/group', { name: 'quotes', members: ['bob', 'carol'] })).json().id as string
  const id = (await alice.post('/v2/message', { recipient: group, body: 'escapes' })).json().id as string
  const odd = ['"\\{},NULL', '\'"\'', '🏳️‍🌈\\"', 'NULL']
  for (const emoji of odd) t.equal((await bob.put(`/v2/message/${id}/reactions/${encodeURIComponent(emoji)}`)).statusCode, 204, emoji)
  for (const reader of [alice, carol]) {
    t.same((await feed(reader, 'message.reaction')).map((e) => e.data.emoji), odd, 'each emoji as it was sent')
  }
})
