import { sql } from 'drizzle-orm'
import t from 'tap'
import { queryRows } from '../../src/db/rows.js'
import { bodySearchHashes } from '../../src/sealing/search-terms.js'
import { checkSealingKeys, WrongSealingKey } from '../../src/sealing/key-check.js'
import { installKeyring, Keyring, parseSealingKeys } from '../../src/sealing/keyring.js'
import { record } from '../../src/sealing/records.js'
import { countPending, runSealingPass } from '../../src/sealing/reseal.js'
import { sealStatus } from '../../src/sealing/seal-status.js'
import type { TestContext } from '../helper.js'
import { freshDatabase } from '../support/databases.js'
import { readContent, writePlainContent } from './support.js'

const K1 = `k1:${'a1'.repeat(32)}`
const K2 = `k2:${'b2'.repeat(32)}`
const K0 = `k0:${'c3'.repeat(32)}`
const ring = (keys: string) => installKeyring(new Keyring(parseSealingKeys(keys)))

async function fresh (t: TestContext) {
  const fresh = await freshDatabase()
  t.teardown(() => fresh.drop())
  return fresh.database.db
}

t.test('the plain pass seals every record written before sealing, and each reads back as it was', async (t) => {
  const db = await fresh(t)
  ring(K1)
  const written = await writePlainContent(db, 'p')
  t.same((await readContent(db, written)).keys, new Set([null]), 'all plain to begin with')
  const pending = await countPending(db, 'plain')
  t.same(pending, { messages: 5, attachments: 2, attachment_chunks: 3, metadata: 5, events: 5 })

  const progress: number[] = []
  const result = await runSealingPass(db, { mode: 'plain', rest: false, onProgress: ({ done }) => progress.push(done) })
  t.same(result.tables, pending)
  t.equal(result.sealed, 20)
  t.same(result.broken, [])
  t.equal(progress.at(-1), 20, 'progress reaches the total')

  const read = await readContent(db, written)
  t.same(read.keys, new Set(['k1']), 'every record under k1')
  t.same(read.content, written, 'every body, file, name, metadata map and event reads back identical')
  const [typing] = await queryRows<{ data: unknown, sealed_by: string | null }>(db, sql`SELECT data, sealed_by FROM events WHERE type = 'typing'`)
  t.same(typing, { data: { from: 'x' }, sealed_by: null }, 'an event that is no copy of a message is left alone')
  const [hashes] = await queryRows<{ h: string }>(db, sql`SELECT search_hashes::text AS h FROM messages WHERE id = 'msg_p0000'`)
  t.equal(hashes!.h, bodySearchHashes(written.bodies.get('msg_p0000')!), 'search hashes computed from the words, under k1')
  const [raw] = await queryRows<{ body: string }>(db, sql`SELECT body FROM messages WHERE id = 'msg_p0000'`)
  t.notMatch(raw!.body, /Hello/, 'the table no longer holds the words')

  const again = await runSealingPass(db, { mode: 'plain', rest: false })
  t.equal(again.sealed, 0, 'a second run finds nothing to do')
})

t.test('rotation re-seals under the first key, recomputes search hashes, and leaves rows under unknown keys and broken ones alone', async (t) => {
  const db = await fresh(t)
  ring(K1)
  const written = await writePlainContent(db, 'r', 450)
  await runSealingPass(db, { mode: 'plain', rest: false })
  // One metadata row under a key that is not configured, one broken record under k1.
  ring(K0)
  const lost = new Keyring(parseSealingKeys(K0)).sealText(JSON.stringify({ gone: true }), record.metadata('orphan'))
  await queryRows(db, sql`INSERT INTO metadata (entity, data, sealed_by) VALUES ('orphan', to_jsonb(${lost}::text), 'k0')`)
  await queryRows(db, sql`UPDATE messages SET body = 'AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA==' WHERE id = 'msg_r0449'`)
  written.bodies.delete('msg_r0449')
  written.metadata.delete('msg_r0449')

  ring(`${K2},${K1}`)
  const pending = await countPending(db, 'rotate')
  t.equal(pending.messages, 450, 'a rotation takes rows under k1')
  t.equal(pending.metadata, 450, 'but not those under k0, which it cannot open')
  const result = await runSealingPass(db, { mode: 'rotate', rest: false })
  t.same(result.broken, [record.messageBody('msg_r0449')], 'the broken record is named, not fatal')
  t.equal(result.tables.messages, 449)
  t.equal(result.tables.events, 450, 'more than a page of each table (200 a page)')

  const read = await readContent(db, written)
  t.same(read.keys, new Set(['k2']))
  t.same(read.content, written)
  const [hashes] = await queryRows<{ h: string }>(db, sql`SELECT search_hashes::text AS h FROM messages WHERE id = 'msg_r0001'`)
  t.equal(hashes!.h, bodySearchHashes(written.bodies.get('msg_r0001')!), 'search hashes under k2')

  const status = await sealStatus(db)
  t.same(status.tables.find((s) => s.table === 'metadata'), { table: 'metadata', plain: 0, byKey: { k2: 450, k0: 1 } })
  t.same(status.tables.find((s) => s.table === 'messages'), { table: 'messages', plain: 0, byKey: { k2: 449, k1: 1 } })
})

t.test('a key that does not open its check value is refused; a new key id gets one', async (t) => {
  const db = await fresh(t)
  await checkSealingKeys(db, parseSealingKeys(K1))
  await checkSealingKeys(db, parseSealingKeys(K1))
  await t.rejects(checkSealingKeys(db, parseSealingKeys(`k1:${'99'.repeat(32)}`)), new WrongSealingKey('k1', 'SEALING_KEYS'))
  await t.rejects(checkSealingKeys(db, parseSealingKeys(`k1:${'99'.repeat(32)}`)),
    { message: 'SEALING_KEYS: key k1 does not open this database\'s data: it is not the key this database was sealed with' })
  await checkSealingKeys(db, parseSealingKeys(`${K2},${K1}`))
  await t.rejects(checkSealingKeys(db, parseSealingKeys(`k2:${'98'.repeat(32)},${K1}`)), new WrongSealingKey('k2', 'SEALING_KEYS'))
})
