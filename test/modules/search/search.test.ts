import t from 'tap'
import { sql } from 'drizzle-orm'
import { queryRows } from '../../../src/db/rows.js'
import { messageSearchQuery, READER_FIRST_MAX, readerFirstQuery, readsAtMost, searchMessages, type MessageSearch } from '../../../src/modules/search/message-search.js'
import { runSealingPass } from '../../../src/sealing/reseal.js'
import { queryTerms } from '../../../src/sealing/search-terms.js'
import { build, type Caller } from '../../helper.js'

type Result = { type: string, message?: { body: string, id: string }, user?: { address: string }, group?: { name: string } }

async function find (caller: Caller, body: Record<string, unknown>, format: 'json' | 'form' = 'json') {
  const res = await caller.post('/v2/search', body, { format })
  if (res.statusCode !== 200) throw new Error(res.body)
  return res.json() as { results: Result[], nextCursor: string | null }
}

const bodies = (results: Result[]) => results.filter((r) => r.type === 'message').map((r) => r.message!.body)

t.test('message search: every word as a prefix, case-insensitive, newest first, only what the caller may read', async (t) => {
  const { as } = await build(t)
  const alice = await as('alice')
  const bob = await as('bob')
  const carol = await as('carol')
  await alice.post('/v2/message', { recipient: 'bob', body: 'Hello world' })
  await bob.post('/v2/message', { recipient: 'alice', body: 'hello there, helpful friend' })
  await alice.post('/v2/message', { recipient: 'bob', body: 'goodbye world' })
  await carol.post('/v2/message', { recipient: 'bob', body: 'hello from carol' })

  t.same(bodies((await find(alice, { query: 'hel', types: ['messages'] })).results), ['hello there, helpful friend', 'Hello world'])
  t.same(bodies((await find(alice, { query: 'WORLD hel', types: 'messages' }, 'form')).results), ['Hello world'], 'every word required')
  t.same(bodies((await find(bob, { query: 'hello', types: ['messages'] })).results), ['hello from carol', 'hello there, helpful friend', 'Hello world'])
  t.same(bodies((await find(carol, { query: 'world', types: ['messages'] })).results), [], 'nothing carol cannot read')

  const hidden = (await find(bob, { query: 'goodbye', types: ['messages'] })).results[0]!.message!
  await bob.delete(`/v2/message/${hidden.id}`)
  t.same(bodies((await find(bob, { query: 'goodbye', types: ['messages'] })).results), [], 'hidden for bob, gone from his search')
  t.same(bodies((await find(alice, { query: 'goodbye', types: ['messages'] })).results), ['goodbye world'])
})

t.test('query syntax and LIKE wildcards in a query are only text', async (t) => {
  const { as } = await build(t)
  const alice = await as('alice')
  await as('bob')
  await alice.post('/v2/message', { recipient: 'bob', body: 'cats & dogs: 100% (really) fine' })
  for (const query of ['cats & dogs', "it's", '!!!', '|', 'a:* | b', '(', "'", '\\', '%', '_', 'dogs:*', '<->', '&&&', '100%']) {
    const res = await alice.post('/v2/search', { query })
    t.equal(res.statusCode, 200, JSON.stringify(query))
  }
  t.same(bodies((await find(alice, { query: '(cats) | !dogs' })).results), ['cats & dogs: 100% (really) fine'])
  t.same((await find(alice, { query: '%', types: ['users'] })).results, [], 'LIKE wildcards match only themselves')
  t.same(queryTerms("it's a:* | b"), ['it', 's', 'a', 'b'], 'a query is its runs of letters and digits')
  t.equal(queryTerms('!!! ...'), undefined)
})

t.test('users and the caller\'s groups match by substring; types choose what is searched', async (t) => {
  const { as, createUser } = await build(t)
  await createUser('ann.smith', 'Ann Smith')
  await createUser('bo', 'Robert Smithson')
  const alice = await as('alice')
  const bob = await as('bob')
  await alice.post('/v2/group', { name: 'Smiths united', members: ['bob'] })
  await bob.post('/v2/group', { name: 'Secret smiths' })
  await alice.post('/v2/message', { recipient: 'bob', body: 'smithing lessons' })

  const all = await find(alice, { query: 'smith' })
  t.same(all.results.map((r) => r.type), ['message', 'user', 'user', 'group'])
  t.same(all.results.filter((r) => r.type === 'user').map((r) => r.user!.address), ['ann.smith', 'bo'])
  t.same(all.results.filter((r) => r.type === 'group').map((r) => r.group!.name), ['Smiths united'], 'only the caller\'s groups')
  t.same((await find(alice, { query: 'smith', types: ['groups'] })).results.map((r) => r.type), ['group'])
  t.match((await alice.post('/v2/search', { query: 'x', types: ['planets'] })).json(), { statusCode: 400, message: /types/ })
})

t.test('with: one conversation, with or without a query; access rules apply', async (t) => {
  const { as } = await build(t)
  const alice = await as('alice')
  const bob = await as('bob')
  const carol = await as('carol')
  await alice.post('/v2/message', { recipient: 'bob', body: 'one' })
  await bob.post('/v2/message', { recipient: 'alice', body: 'two' })
  await alice.post('/v2/message', { recipient: 'carol', body: 'three' })
  const group = (await alice.post('/v2/group', { name: 'g', members: ['bob'] })).json()
  await bob.post('/v2/message', { recipient: group.id, body: 'group one' })

  t.same(bodies((await find(alice, { with: 'bob' })).results), ['two', 'one'], 'the conversation, newest first')
  t.same(bodies((await find(alice, { with: 'bob', query: 'tw' })).results), ['two'])
  t.same(bodies((await find(alice, { with: group.id })).results), ['group one'])
  t.same((await find(alice, { with: 'bob' })).results.map((r) => r.type), ['message', 'message'], 'listing means messages only')
  t.match((await carol.post('/v2/search', { with: group.id })).json(), { statusCode: 403 })
  t.match((await alice.post('/v2/search', { with: 'nobody' })).json(), { statusCode: 404 })
  t.match((await alice.post('/v2/search', {})).json(), { statusCode: 400, message: 'query: required unless with is given' })
  t.match((await alice.post('/v2/search', { query: '' })).json(), { statusCode: 400, message: /query/ })
  t.match((await alice.post('/v2/search', { query: 'x'.repeat(201) })).json(), { statusCode: 400, message: /query/ })
})

t.test('pages follow nextCursor with no overlap and no gap, across result types', async (t) => {
  const { as, createUser } = await build(t, { env: { RATE_LIMIT_PER_SECOND: '1000' } })
  const alice = await as('alice')
  await as('bob')
  for (let i = 0; i < 7; i++) await alice.post('/v2/message', { recipient: 'bob', body: `needle ${i}` })
  for (const name of ['needle-a', 'needle-b', 'needle-c']) await createUser(name)
  await alice.post('/v2/group', { name: 'needle group' })

  const seen: string[] = []
  let cursor: string | null | undefined
  let pages = 0
  do {
    const page = await find(alice, { query: 'needle', limit: 3, ...(cursor ? { cursor } : {}) })
    seen.push(...page.results.map((r) => r.message?.body ?? r.user?.address ?? r.group!.name))
    cursor = page.nextCursor
    pages++
  } while (cursor !== null && pages < 10)
  t.same(seen, [
    'needle 6', 'needle 5', 'needle 4', 'needle 3', 'needle 2', 'needle 1', 'needle 0',
    'needle-a', 'needle-b', 'needle-c', 'needle group'
  ])
  t.match((await alice.post('/v2/search', { query: 'needle', cursor: 'garbage' })).json(), { statusCode: 400, message: /cursor/ })
})

const MESSAGES = 10_000

t.test('a search costs what the caller can read: reader-first for a small reader, the GIN index for a large one', async (t) => {
  const { as, db } = await build(t)
  await as('alice')
  await as('bob')
  await as('carol')
  // 10,000 messages between alice and bob (five times what reader-first reads at most); carol
  // received three of them and sent one.
  await db.execute(sql`
    INSERT INTO messages (id, sender, recipient, body, created_at)
    SELECT 'msg_' || lpad(g::text, 26, '0'), CASE WHEN g % 2 = 0 THEN 'alice' ELSE 'bob' END,
           CASE WHEN g % 2 = 0 THEN 'bob' ELSE 'alice' END,
           'filler text number ' || g || CASE WHEN g % 500 = 0 THEN ' zebra' ELSE '' END,
           now() - (g || ' seconds')::interval
    FROM generate_series(1, ${MESSAGES}) AS g`)
  await db.execute(sql`
    INSERT INTO deliveries (message_id, recipient, hidden_at)
    SELECT 'msg_' || lpad(g::text, 26, '0'), CASE WHEN g % 2 = 0 THEN 'bob' ELSE 'alice' END, NULL::timestamptz FROM generate_series(1, ${MESSAGES}) AS g
    UNION ALL VALUES ('msg_' || lpad('10'::text, 26, '0'), 'carol', NULL), ('msg_' || lpad('5000'::text, 26, '0'), 'carol', NULL),
                     ('msg_' || lpad('7'::text, 26, '0'), 'carol', now())`)
  await db.execute(sql`INSERT INTO messages (id, sender, recipient, body) VALUES ('msg_carol000000000000000000000', 'carol', 'bob', 'filler from carol')`)
  // Written plain, as a database from before sealing: the sealing pass seals them and hashes their words.
  await runSealingPass(db, { mode: 'plain', rest: false })
  await db.execute(sql`ANALYZE`)

  t.equal(await readsAtMost(db, 'carol', READER_FIRST_MAX), true, 'carol reads a handful: reader-first')
  t.equal(await readsAtMost(db, 'alice', READER_FIRST_MAX), false, `alice reads ${MESSAGES}: index-first`)

  const carolPlan = await explain(db, readerFirstQuery(db, { viewer: 'carol', terms: queryTerms('fi'), limit: 51 }).toSQL())
  t.notMatch(carolPlan, /messages_search_idx|Seq Scan on messages/, `carol's two-letter search reads neither the GIN index nor the table:\n${carolPlan}`)
  const alicePlan = await explain(db, messageSearchQuery(db, { viewer: 'alice', terms: queryTerms('zebra'), limit: 51 }).toSQL())
  t.match(alicePlan, /messages_search_idx/, `alice's search reads the GIN index:\n${alicePlan}`)

  // The two plans are one answer: whoever asks, whatever the words, page or conversation.
  const searches: MessageSearch[] = [
    { viewer: 'carol', terms: queryTerms('fi'), limit: 51 },
    { viewer: 'carol', terms: queryTerms('zebra'), limit: 51 },
    { viewer: 'carol', terms: queryTerms('filler t'), limit: 1 },
    { viewer: 'carol', terms: queryTerms('filler'), limit: 51, with: { kind: 'user', address: 'bob' } },
    { viewer: 'alice', terms: queryTerms('zebra'), limit: 51 },
    { viewer: 'alice', terms: queryTerms('number 99'), limit: 5, before: { createdAt: new Date(Date.now() - 5_000_000).toISOString(), id: 'msg_z' } },
    { viewer: 'bob', terms: queryTerms('carol'), limit: 51 }
  ]
  for (const s of searches) {
    const [table, reader] = await Promise.all([messageSearchQuery(db, s), readerFirstQuery(db, s)])
    t.same(reader.map((m) => m.id), table.map((m) => m.id), `both plans agree on ${JSON.stringify(s)} (${table.length} found)`)
  }
  t.same((await searchMessages(db, searches[0]!)).rows.map((m) => m.body), ['filler from carol', 'filler text number 10', 'filler text number 5000 zebra'], 'carol never sees the message she hid')
  t.equal((await searchMessages(db, searches[4]!)).rows.length, 20, 'the 20 zebra messages alice sent')
})

async function explain (db: Parameters<typeof queryRows>[0], query: { sql: string, params: unknown[] }): Promise<string> {
  const plan = await queryRows<{ 'QUERY PLAN': string }>(db, sql.raw(`EXPLAIN ${inline(query.sql, query.params)}`))
  return plan.map((row) => row['QUERY PLAN']).join('\n')
}

/** The query with its parameters written in, for EXPLAIN (the values are the test's own). */
function inline (text: string, params: unknown[]): string {
  return text.replace(/\$(\d+)/g, (_, n: string) => {
    const value = params[Number(n) - 1]
    return typeof value === 'number' ? String(value) : `'${String(value).replace(/'/g, "''")}'`
  })
}

t.test('a query whose candidates all fail the exact check reads a bounded number of them a page: short pages, a cursor past the last read, the match behind them found', async (t) => {
  const { as } = await build(t, { env: { DAILY_MESSAGE_QUOTA: '1000', RATE_LIMIT_PER_SECOND: '100000' } })
  const alice = await as('alice')
  await as('bob')
  await alice.post('/v2/message', { recipient: 'bob', body: 'internationalization, the one match' })
  // 100 newer candidates share its first 12 characters and fail "internationaliz".
  for (let i = 0; i < 100; i++) await alice.post('/v2/message', { recipient: 'bob', body: `internationals ${i}` })
  // A page of 2 reads 3, 6, 12 and 24 candidates (SEARCH_ROUNDS_MAX rounds): 45, then ends.
  const pages: { bodies: string[], more: boolean }[] = []
  let cursor: string | null | undefined
  do {
    const page = await find(alice, { query: 'internationaliz', types: ['messages'], limit: 2, ...cursor === undefined ? {} : { cursor } })
    pages.push({ bodies: bodies(page.results), more: page.nextCursor !== null })
    cursor = page.nextCursor
  } while (cursor !== null && pages.length < 10)
  t.same(pages, [
    { bodies: [], more: true },
    { bodies: [], more: true },
    { bodies: ['internationalization, the one match'], more: false }
  ], 'two short pages of 45 candidates each, then the rest and the match')
})

t.test('search finds what users type inside addresses, host and file names, paths and decimals', async (t) => {
  const { as } = await build(t)
  const alice = await as('alice')
  await as('bob')
  const bodies = [
    'write to alice@example.org today',
    'see report.pdf attached',
    'mirror at files.example.net/pub/v2 now',
    'pi is 3.14 roughly'
  ]
  for (const body of bodies) await alice.post('/v2/message', { recipient: 'bob', body })
  const cases: [string, string][] = [
    ['alice@example.org', bodies[0]!], ['example.org', bodies[0]!], ['report.pdf', bodies[1]!], ['report', bodies[1]!],
    ['pdf', bodies[1]!], ['files.example.net', bodies[2]!], ['pub', bodies[2]!], ['/pub/v2', bodies[2]!], ['3.14', bodies[3]!]
  ]
  for (const [query, body] of cases) {
    const found = await find(alice, { query, types: ['messages'] })
    t.same(found.results.map((r) => r.message!.body), [body], `"${query}" finds "${body}"`)
  }
  const example = await find(alice, { query: 'example', types: ['messages'] })
  t.same(example.results.map((r) => r.message!.body).sort(), [bodies[0], bodies[2]].sort(), '"example" finds both messages that hold it')
})

t.test('words longer than the hashed prefixes: the index finds candidates by their start, and only true matches come back, pages full', async (t) => {
  const { as } = await build(t)
  const alice = await as('alice')
  await as('bob')
  // Both share their first PREFIX_MAX (12) characters, "internationa": the index cannot tell them apart.
  for (let i = 0; i < 5; i++) await alice.post('/v2/message', { recipient: 'bob', body: `internationalization ${i}` })
  for (let i = 0; i < 5; i++) await alice.post('/v2/message', { recipient: 'bob', body: `internationals ${i}` })
  t.same(bodies((await find(alice, { query: 'internationaliz', types: ['messages'] })).results),
    ['internationalization 4', 'internationalization 3', 'internationalization 2', 'internationalization 1', 'internationalization 0'])
  t.same(bodies((await find(alice, { query: 'INTERNATIONALS', types: ['messages'] })).results).length, 5)
  t.same(bodies((await find(alice, { query: 'internationa', types: ['messages'] })).results).length, 10, 'the shared start finds both')
  // A page of 2 is filled past the 5 newer candidates that fail the check.
  const first = await find(alice, { query: 'internationaliz', types: ['messages'], limit: 2 })
  t.same(bodies(first.results), ['internationalization 4', 'internationalization 3'])
  t.ok(first.nextCursor !== null)
  const second = await find(alice, { query: 'internationaliz', types: ['messages'], limit: 2, cursor: first.nextCursor })
  t.same(bodies(second.results), ['internationalization 2', 'internationalization 1'])
  // A one-character word finds itself, not every word it starts.
  await alice.post('/v2/message', { recipient: 'bob', body: 'x marks the spot' })
  t.same(bodies((await find(alice, { query: 'x', types: ['messages'] })).results), ['x marks the spot'])
})
