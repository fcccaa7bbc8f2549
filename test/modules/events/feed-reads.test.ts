import t from 'tap'
import { createEventsRepository, type PageRead } from '../../../src/modules/events/events.repository.js'
import { createFeedReads } from '../../../src/modules/events/feed-reads.js'
import type { EventRow } from '../../../src/modules/events/events.table.js'
import { createKeysRepository } from '../../../src/modules/keys/keys.repository.js'
import { build } from '../../helper.js'

const seqs = (rows: EventRow[]) => rows.map((r) => r.seq)

t.test('reads gathered into one statement answer each what its own read would', async (t) => {
  const { as, createKey, callerFor, db } = await build(t)
  const events = createEventsRepository(db)
  const alice = await as('alice')
  const bob = await as('bob')
  await as('carol')
  // Feeds of different lengths and sizes: bob's holds large events, so a byte cap cuts it.
  for (let i = 0; i < 12; i++) t.equal((await alice.post('/v2/message', { recipient: 'bob', body: `${'x'.repeat(9_000)} ${i}` })).statusCode, 200)
  for (let i = 0; i < 5; i++) t.equal((await bob.post('/v2/message', { recipient: 'alice', body: `hello ${i}` })).statusCode, 200)
  const bobKeys = await createKeysRepository(db).list('bob')
  const bobKey = bobKeys[0]!.id
  const second = await createKey('bob')
  const secondCaller = callerFor('bob', second)
  const feed = (await events.page('bob', 0, 1000, 1 << 30, bobKey)).map((r) => r.seq)
  // The second key acknowledges some of bob's events: its reads skip them, the first key's do not.
  t.equal((await secondCaller.post('/v2/events/ack', { upTo: String(feed[3]), ids: [String(feed[6])] })).statusCode, 204)
  const revoked = await createKey('alice')
  await createKeysRepository(db).revoke(revoked.keyId)
  const aliceKey = (await createKeysRepository(db).list('alice')).find((k) => k.revokedAt === null)!.id
  const carolKey = (await createKeysRepository(db).list('carol'))[0]!.id

  const reads: PageRead[] = [
    { address: 'bob', after: 0, limit: 100, maxBytes: 256 * 1024, keyId: bobKey },
    { address: 'bob', after: 0, limit: 100, maxBytes: 256 * 1024, keyId: second.keyId },
    { address: 'bob', after: feed[8]!, limit: 100, maxBytes: 256 * 1024, keyId: bobKey },
    { address: 'bob', after: 0, limit: 3, maxBytes: 256 * 1024, keyId: bobKey },
    { address: 'bob', after: 0, limit: 100, maxBytes: 50_000, keyId: bobKey },
    { address: 'bob', after: 0, limit: 100, maxBytes: 1, keyId: bobKey },
    { address: 'alice', after: 0, limit: 100, maxBytes: 256 * 1024, keyId: aliceKey },
    { address: 'alice', after: 0, limit: 100, maxBytes: 256 * 1024, keyId: revoked.keyId },
    { address: 'carol', after: 0, limit: 100, maxBytes: 256 * 1024, keyId: carolKey },
    // A key reading a feed that is not its user's finds nothing.
    { address: 'bob', after: 0, limit: 100, maxBytes: 256 * 1024, keyId: aliceKey }
  ]
  const alone = await Promise.all(reads.map((r) => events.page(r.address, r.after, r.limit, r.maxBytes, r.keyId)))
  t.ok(alone[0]!.length > alone[4]!.length && alone[4]!.length > 1, `a byte cap cuts a page short (${alone[4]!.length} of ${alone[0]!.length})`)
  t.equal(alone[5]!.length, 1, 'at least one event however small the cap')
  t.equal(alone[1]!.length, alone[0]!.length - 5, 'a key skips what it acknowledged')
  t.same(alone[7], [], 'a revoked key reads nothing')
  t.same(alone[9], [], 'nor does a key another user\'s feed')

  const together = await events.pages(reads)
  t.same(together.map(seqs), alone.map(seqs), 'one statement: each read\'s events, in order')
  t.same(together, alone, 'and each row as page() reads it')

  // Through the gatherer: twenty reads asked for at once, four to a statement, one statement
  // at a time, are five statements, and each read gets its own answer.
  const statements: number[] = []
  const gathered = createFeedReads(async (batch) => {
    statements.push(batch.length)
    return events.pages(batch)
  }, { perStatement: 4, inFlight: 1 })
  const twenty = Array.from({ length: 20 }, (_, i) => reads[i % reads.length]!)
  const answers = await Promise.all(twenty.map((r) => gathered.page(r)))
  t.same(answers.map(seqs), twenty.map((_, i) => seqs(alone[i % reads.length]!)), 'each gathered read answers its own page')
  t.same(statements, [4, 4, 4, 4, 4], 'twenty reads asked for at once went out in five statements')

  // Reads asked for while a statement runs join the next one.
  statements.length = 0
  const first = gathered.page(reads[0]!)
  await new Promise((resolve) => setImmediate(resolve))
  const later = [gathered.page(reads[1]!), gathered.page(reads[2]!), gathered.page(reads[6]!)]
  t.same((await first).map((r) => r.seq), seqs(alone[0]!))
  t.same((await Promise.all(later)).map(seqs), [seqs(alone[1]!), seqs(alone[2]!), seqs(alone[6]!)])
  t.same(statements, [1, 3], 'the reads asked for while one ran went out together after it')

  // The same read asked for by several connections at once is read once, each given its rows.
  statements.length = 0
  const same = await Promise.all([reads[0]!, reads[0]!, reads[1]!, reads[0]!, { ...reads[0]!, after: feed[8]! }].map((r) => gathered.page(r)))
  t.same(same.map(seqs), [seqs(alone[0]!), seqs(alone[0]!), seqs(alone[1]!), seqs(alone[0]!), seqs(alone[2]!)], 'each connection gets its read\'s rows')
  t.same(statements, [3], 'five reads, three of them alike, were three distinct reads in one statement')
})

t.test('a failed statement fails the reads it carried, and the next goes out', async (t) => {
  let calls = 0
  const gathered = createFeedReads(async (batch) => {
    if (calls++ === 0) throw new Error('the database went away')
    return batch.map((r) => [{ address: r.address, seq: r.after + 1 } as EventRow])
  }, { perStatement: 8, inFlight: 1 })
  const read = (address: string): PageRead => ({ address, after: 1, limit: 1, maxBytes: 1, keyId: 'k' })
  const failed = await Promise.allSettled([gathered.page(read('a')), gathered.page(read('b'))])
  t.same(failed.map((r) => r.status), ['rejected', 'rejected'], 'both reads of the failed statement fail')
  t.same((await gathered.page(read('c'))).map((r) => r.address), ['c'], 'a read after it is answered')
})
