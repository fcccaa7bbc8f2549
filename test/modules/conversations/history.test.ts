import { sql } from 'drizzle-orm'
import t from 'tap'
import { queryRows } from '../../../src/db/rows.js'
import { historyStatement } from '../../../src/modules/conversations/conversations.repository.js'
import { deliveredSince } from '../../../src/modules/conversations/conversations.service.js'
import { newId } from '../../../src/ids.js'
import { usingPostgres } from '../../support/databases.js'
import { build, type Caller } from '../../helper.js'

interface Page { messages: { id: string, sender: string, body: string }[], next: string | null }

async function page (caller: Caller, peer: string, query = ''): Promise<Page> {
  const res = await caller.get(`/v2/conversations/${peer}/messages${query}`)
  if (res.statusCode !== 200) throw new Error(`${res.statusCode} ${res.body}`)
  return res.json() as Page
}

/** Every page from the start in one direction, following `next`: the bodies in order. */
async function walk (caller: Caller, peer: string, dir: 'back' | 'forward', limit: number): Promise<string[]> {
  const bodies: string[] = []
  let from: string | null = null
  for (let i = 0; i < 100; i++) {
    const p: Page = await page(caller, peer, `?dir=${dir}&limit=${limit}${from === null ? '' : `&from=${from}`}`)
    t.ok(p.messages.length <= limit, `a page holds at most ${limit}`)
    bodies.push(...p.messages.map((m) => m.body))
    if (p.next === null) return bodies
    t.equal(p.next, p.messages.at(-1)!.id, 'next is the last message shown')
    from = p.next
  }
  throw new Error('no end')
}

t.test('a 1:1 history pages both ways, both parties\' messages, newest first by default', async (t) => {
  const { as } = await build(t)
  const alice = await as('alice')
  const bob = await as('bob')
  const carol = await as('carol')
  const sent: string[] = []
  for (let i = 0; i < 7; i++) {
    const [from, to] = i % 2 === 0 ? [alice, 'bob'] : [bob, 'alice']
    const res = await from.post('/v2/message', { recipient: to, body: `m${i}` })
    t.equal(res.statusCode, 200)
    sent.push(`m${i}`)
  }
  await carol.post('/v2/message', { recipient: 'alice', body: 'not this conversation' })
  await alice.post('/v2/message', { recipient: 'carol', body: 'nor this' })

  const first = await page(alice, 'bob')
  t.same(first.messages.map((m) => m.body), [...sent].reverse(), 'newest first, both ways, nothing of other conversations')
  t.equal(first.next, null)
  t.same(await walk(alice, 'bob', 'back', 3), [...sent].reverse(), 'back in pages of 3')
  t.same(await walk(bob, 'alice', 'forward', 2), sent, 'forward in pages of 2, from the other side')
  t.same(await walk(alice, 'BOB', 'forward', 200), sent, 'the peer\'s address is case-insensitive')

  // From any message, either way.
  const middle = first.messages[3]!.id
  t.same((await page(alice, 'bob', `?from=${middle}&limit=2`)).messages.map((m) => m.body), ['m2', 'm1'])
  t.same((await page(alice, 'bob', `?from=${middle}&dir=forward`)).messages.map((m) => m.body), ['m4', 'm5', 'm6'])
})

t.test('a history leaves out what the caller hid and what was deleted, and pages on from a deleted message', async (t) => {
  const { as } = await build(t)
  const alice = await as('alice')
  const bob = await as('bob')
  const ids: string[] = []
  for (let i = 0; i < 6; i++) ids.push((await bob.post('/v2/message', { recipient: 'alice', body: `b${i}` })).json().id as string)
  // Alice hides b1 (her copy only); bob deletes b4 (everyone's).
  t.equal((await alice.delete(`/v2/message/${ids[1]}`)).statusCode, 204)
  t.equal((await bob.delete(`/v2/message/${ids[4]}`)).statusCode, 204)
  const mine = await walk(alice, 'bob', 'back', 2)
  t.same(mine, ['b5', 'b3', 'b2', 'b0'], 'alice: neither the hidden nor the deleted')
  const bobs = await walk(bob, 'alice', 'back', 2)
  t.same(bobs, ['b5', 'b3', 'b2', 'b1', 'b0'], 'bob still sees what alice hid')

  // A page's `next` deleted before the next page is asked for: the page goes on after it.
  const one = await page(alice, 'bob', '?limit=2')
  t.same(one.messages.map((m) => m.body), ['b5', 'b3'])
  t.equal((await bob.delete(`/v2/message/${one.next}`)).statusCode, 204)
  t.same((await page(alice, 'bob', `?from=${one.next}`)).messages.map((m) => m.body), ['b2', 'b0'])
})

t.test('a group\'s history is for members: what was delivered to them and what they sent', async (t) => {
  const { as } = await build(t)
  const alice = await as('alice')
  const bob = await as('bob')
  const carol = await as('carol')
  const group = (await alice.post('/v2/group', { name: 'ops', members: ['bob'] })).json().id as string
  await alice.post('/v2/message', { recipient: group, body: 'before carol' })
  await bob.post('/v2/message', { recipient: group, body: 'bob before carol' })
  t.equal((await page(carol, 'alice')).messages.length, 0, 'carol and alice have no conversation yet: an empty page')
  t.equal((await carol.get(`/v2/conversations/${group}/messages`)).statusCode, 403, 'a stranger may not page a group')
  t.equal((await alice.post(`/v2/group/${group}/members`, { members: ['carol'] })).statusCode, 200)
  await carol.post('/v2/message', { recipient: group, body: 'carol here' })
  await bob.post('/v2/message', { recipient: group, body: 'welcome' })

  t.same(await walk(alice, group, 'forward', 2), ['before carol', 'bob before carol', 'carol here', 'welcome'])
  t.same(await walk(carol, group, 'back', 1), ['welcome', 'carol here'], 'carol sees only what reached her, and her own')
  const unknown = `grp_${'0'.repeat(26)}`
  t.equal((await alice.get(`/v2/conversations/${unknown}/messages`)).statusCode, 404)
})

t.test('history: bad peers, positions, directions and limits answer 400 or 404 naming them', async (t) => {
  const { as } = await build(t)
  const alice = await as('alice')
  const cases: [string, number, RegExp][] = [
    ['/v2/conversations/nobody/messages', 404, /user nobody not found/],
    ['/v2/conversations/no%20such/messages', 400, /peer/],
    ['/v2/conversations/alice/messages?from=msg_1', 400, /from/],
    ['/v2/conversations/alice/messages?dir=up', 400, /dir/],
    ['/v2/conversations/alice/messages?limit=0', 400, /limit/],
    ['/v2/conversations/alice/messages?limit=201', 400, /limit/]
  ]
  for (const [url, status, message] of cases) {
    const res = await alice.get(url)
    t.equal(res.statusCode, status, url)
    t.match(res.json(), { statusCode: status, message }, url)
  }
  t.same(await page(alice, 'alice'), { messages: [], next: null }, 'a conversation with oneself, empty')
  await alice.post('/v2/message', { recipient: 'alice', body: 'note to self' })
  t.same((await page(alice, 'alice')).messages.map((m) => m.body), ['note to self'], 'a note to oneself, once')
})

t.test('a history page reads an index run of its own length, however long the conversation', { skip: usingPostgres() ? false : 'EXPLAIN on PostgreSQL' }, async (t) => {
  const { as, db } = await build(t)
  const alice = await as('alice')
  await as('bob')
  await as('carol')
  // 20,000 messages between alice and bob (each way in turn) among 100,000 between others,
  // written directly: the send is not what is measured here.
  await db.execute(sql`
    INSERT INTO messages (id, sender, recipient, body)
    SELECT 'msg_' || lpad(to_hex(g), 26, '0'),
      CASE WHEN g % 6 = 0 THEN 'alice' WHEN g % 6 = 3 THEN 'bob' ELSE 'carol' END,
      CASE WHEN g % 6 = 0 THEN 'bob' WHEN g % 6 = 3 THEN 'alice' ELSE 'dave' END, 'x' || g
    FROM generate_series(1, 120000) g`)
  await db.execute(sql`INSERT INTO deliveries (message_id, recipient) SELECT id, recipient FROM messages`)
  await db.execute(sql`ANALYZE messages`)
  await db.execute(sql`ANALYZE deliveries`)
  const deep = `msg_${(60000).toString(16).padStart(26, '0')}`
  const shown = (await page(alice, 'bob', `?from=${deep}&limit=50`)).messages
  t.equal(shown.length, 50)
  t.ok(shown.every((m) => m.id < deep), 'all before the position')
  for (const from of [undefined, deep]) {
    // The repository's own statement, explained as it runs.
    const plan = await queryRows<{ 'QUERY PLAN': unknown }>(db, sql`EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ${historyStatement('alice', 'bob', { from, dir: 'back', limit: 51 })}`)
    const text = JSON.stringify(plan[0]!['QUERY PLAN'])
    const where = from === undefined ? 'at the newest' : 'deep'
    t.ok(text.includes('messages_conversation_idx'), `the conversation index serves the page ${where}`)
    t.notOk(text.includes('"Seq Scan"'), `no sequential scan ${where}`)
    // Alice's own half has no delivery to look up: its blocks are the index run's and its rows'.
    // Started at the newest and walked back to the position (the id bound left out), it read 155 here.
    const scans: { 'Index Name'?: string, 'Index Cond'?: string, 'Shared Hit Blocks': number, 'Shared Read Blocks': number, Plans?: unknown[] }[] = []
    const walk = (node: Record<string, unknown>) => {
      scans.push(node as (typeof scans)[number])
      for (const child of (node.Plans as Record<string, unknown>[] | undefined) ?? []) walk(child)
    }
    walk((plan[0]!['QUERY PLAN'] as [{ Plan: Record<string, unknown> }])[0].Plan)
    const own = scans.find((n) => n['Index Name'] === 'messages_conversation_idx' && n['Index Cond']?.includes("sender = 'alice'"))
    const blocks = own!['Shared Hit Blocks'] + own!['Shared Read Blocks']
    t.ok(blocks <= 12, `alice's half reads ${blocks} blocks ${where}, not its way from the newest`)
    const read = [...text.matchAll(/"(?:Actual Rows|Rows Removed by Filter)":(\d+)/g)].reduce((sum, m) => sum + Number(m[1]), 0)
    t.ok(read < 500, `the plan's nodes touch ${read} rows in all ${where}, not the conversation's 40,000`)
  }
})

t.test('a member who joined a long-lived group pages from its joining, not through the group\'s past', { skip: usingPostgres() ? false : 'EXPLAIN on PostgreSQL' }, async (t) => {
  const { as, db } = await build(t)
  const alice = await as('alice')
  const carol = await as('carol')
  const group = (await alice.post('/v2/group', { name: 'old', members: [] })).json().id as string
  // 20,000 messages from the hour before carol joined, none delivered to her.
  const hourAgo = Date.now() - 3_600_000
  const ids = Array.from({ length: 20_000 }, (_, i) => newId('msg', hourAgo + i))
  await db.execute(sql`INSERT INTO messages (id, sender, recipient, body) SELECT id, 'alice', ${group}, 'before' FROM unnest(${sql.param(ids)}::text[]) AS id`)
  await db.execute(sql`ANALYZE messages`)
  t.equal((await alice.post(`/v2/group/${group}/members`, { members: ['carol'] })).statusCode, 200)
  for (let i = 0; i < 3; i++) await alice.post('/v2/message', { recipient: group, body: `after ${i}` })

  t.same((await page(carol, group)).messages.map((m) => m.body), ['after 2', 'after 1', 'after 0'])
  t.same((await page(carol, group, '?dir=forward')).messages.map((m) => m.body), ['after 0', 'after 1', 'after 2'])
  const since = await deliveredSince(db, 'carol', group)
  const plan = await queryRows<{ 'QUERY PLAN': unknown }>(db, sql`EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ${historyStatement('carol', group, { from: undefined, dir: 'back', limit: 51, since })}`)
  const root = (plan[0]!['QUERY PLAN'] as [{ Plan: { 'Shared Hit Blocks': number, 'Shared Read Blocks': number } }])[0].Plan
  const blocks = root['Shared Hit Blocks'] + root['Shared Read Blocks']
  t.ok(blocks < 100, `carol's first page reads ${blocks} blocks, not the 20,000 messages before her`)
})
