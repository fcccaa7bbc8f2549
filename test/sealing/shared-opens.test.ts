import t from 'tap'
import { Keyring, parseSealingKeys, SealBroken } from '../../src/sealing/keyring.js'

const ring = () => new Keyring(parseSealingKeys(`k1:${'a1'.repeat(32)},k0:${'b2'.repeat(32)}`))

t.test('a record opened for many readers answers what opening it answers, and only for its own name and key', async (t) => {
  const keys = ring()
  const sealed = keys.sealText('{"message":"hi"}', 'events.data:message.received:msg_1')
  t.equal(keys.openTextShared(sealed, 'events.data:message.received:msg_1', 'k1'), '{"message":"hi"}')
  t.equal(keys.openTextShared(sealed, 'events.data:message.received:msg_1', 'k1'), '{"message":"hi"}', 'again, kept')
  t.throws(() => keys.openTextShared(sealed, 'events.data:message.received:msg_2', 'k1'), SealBroken,
    'moved to another record, it does not open, though the same ciphertext is kept for its own')
  t.throws(() => keys.openTextShared(sealed, 'events.data:message.received:msg_1', 'k0'), SealBroken, 'nor under another key')
  t.throws(() => keys.openTextShared(sealed, 'events.data:message.received:msg_1', 'gone'), { code: 'SEALED_KEY_MISSING' },
    'a key the ring does not hold is named, as open names it')
  const changed = Buffer.from(sealed, 'base64')
  changed[changed.length - 1]! ^= 1
  t.throws(() => keys.openTextShared(changed.toString('base64'), 'events.data:message.received:msg_1', 'k1'), SealBroken, 'a changed ciphertext does not open')
})

t.test('many large records in turn, more than it keeps: each opens to its own text every time', async (t) => {
  const keys = ring()
  const records = Array.from({ length: 300 }, (_, i) => {
    const plain = `${i}:${'x'.repeat(30_000)}`
    return { plain, name: `events.data:message.received:msg_${i}`, sealed: keys.sealText(plain, `events.data:message.received:msg_${i}`) }
  })
  // 300 records of about 70,000 characters each, ciphertext and plaintext: 21 MB if all were kept.
  for (let round = 0; round < 2; round++) {
    t.ok(records.every((r) => keys.openTextShared(r.sealed, r.name, 'k1') === r.plain), `round ${round + 1}: every record opens to its own text`)
  }
  const big = 'y'.repeat(100_000)
  const bigSealed = keys.sealText(big, 'events.data:message.received:big')
  t.equal(keys.openTextShared(bigSealed, 'events.data:message.received:big', 'k1'), big, 'a record over the per-record bound opens, unkept')
})
