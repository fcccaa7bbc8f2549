import t from 'tap'
import { Keyring, parseSealingKeys, SealBroken } from '../../src/sealing/keyring.js'

/** A keyring that counts what it really opens (openTextShared's misses), on a clock the test moves. */
function countingRing () {
  const clock = { now: 0 }
  const keys = new Keyring(parseSealingKeys(`k1:${'a1'.repeat(32)},k0:${'b2'.repeat(32)}`), () => clock.now)
  const openText = keys.openText.bind(keys)
  const counted = { opened: 0 }
  keys.openText = (sealed: string, record: string, keyId: string) => {
    counted.opened++
    return openText(sealed, record, keyId)
  }
  return { keys, counted, clock }
}

t.test('a record opened for many readers is opened once, and answers only for its own name and key', async (t) => {
  const { keys, counted } = countingRing()
  const name = 'events.data:message.received:msg_1'
  const sealed = keys.sealText('{"message":"hi"}', name)
  t.equal(keys.openTextShared(sealed, name, 'k1'), '{"message":"hi"}')
  t.equal(keys.openTextShared(sealed, name, 'k1'), '{"message":"hi"}')
  t.equal(counted.opened, 1, 'the second reader was answered without opening it again')
  t.throws(() => keys.openTextShared(sealed, 'events.data:message.received:msg_2', 'k1'), SealBroken,
    'moved to another record, it does not open, though the same ciphertext was kept for its own')
  t.throws(() => keys.openTextShared(sealed, name, 'k0'), SealBroken, 'nor under another key')
  t.throws(() => keys.openTextShared(sealed, name, 'gone'), { code: 'SEALED_KEY_MISSING' }, 'a key the ring does not hold is named, as open names it')
  const changed = Buffer.from(sealed, 'base64')
  changed[changed.length - 1]! ^= 1
  t.throws(() => keys.openTextShared(changed.toString('base64'), name, 'k1'), SealBroken, 'a changed ciphertext does not open')
})

t.test('what it keeps is bounded: past 4 Mi characters the least recently read go first, and each record still opens right', async (t) => {
  const { keys, counted } = countingRing()
  // About 33,000 characters each, ciphertext and plaintext: 300 would be 9.9 Mi if all were kept.
  const records = Array.from({ length: 300 }, (_, i) => {
    const plain = `${i}:${'x'.repeat(14_000)}`
    const name = `events.data:message.received:msg_${i}`
    return { plain, name, sealed: keys.sealText(plain, name) }
  })
  t.ok(records.every((r) => keys.openTextShared(r.sealed, r.name, 'k1') === r.plain), 'every record opens to its own text')
  t.equal(counted.opened, 300)
  const { records: kept, chars } = keys.sharedOpens
  t.ok(chars <= 4 * 1024 * 1024 && chars > 3.9 * 1024 * 1024, `kept ${chars} characters, at the bound`)
  t.ok(kept > 100 && kept < 300, `${kept} of 300 kept`)
  counted.opened = 0
  const last = records.at(-1)!
  t.equal(keys.openTextShared(last.sealed, last.name, 'k1'), last.plain)
  t.equal(counted.opened, 0, 'the most recently read is kept')
  t.equal(keys.openTextShared(records[0]!.sealed, records[0]!.name, 'k1'), records[0]!.plain)
  t.equal(counted.opened, 1, 'the least recently read was dropped, and opens again')
  const big = 'y'.repeat(100_000)
  const bigSealed = keys.sealText(big, 'events.data:message.received:big')
  t.equal(keys.openTextShared(bigSealed, 'events.data:message.received:big', 'k1'), big, 'a record over the per-record bound opens')
  t.ok(keys.sharedOpens.chars <= 4 * 1024 * 1024, 'and is not kept')
})

t.test('a record nobody read for a minute is dropped at the next miss, however little is kept', async (t) => {
  const { keys, counted, clock } = countingRing()
  const sealedAs = (name: string) => keys.sealText(`{"for":"${name}"}`, name)
  const first = sealedAs('events.data:message.received:msg_a')
  const second = sealedAs('events.data:message.received:msg_b')
  keys.openTextShared(first, 'events.data:message.received:msg_a', 'k1')
  clock.now += 59_000
  keys.openTextShared(second, 'events.data:message.received:msg_b', 'k1')
  t.equal(keys.sharedOpens.records, 2, 'within the minute both are kept')
  clock.now += 2_000
  keys.openTextShared(sealedAs('events.data:message.received:msg_c'), 'events.data:message.received:msg_c', 'k1')
  t.equal(keys.sharedOpens.records, 2, 'the one idle past the minute went at the next miss; the one read 2 s ago stays')
  counted.opened = 0
  keys.openTextShared(second, 'events.data:message.received:msg_b', 'k1')
  t.equal(counted.opened, 0, 'the one still fresh answers without opening')
  keys.openTextShared(first, 'events.data:message.received:msg_a', 'k1')
  t.equal(counted.opened, 1, 'the idle one opens again')
})
