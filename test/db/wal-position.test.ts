import t from 'tap'
import { normalizePosition, parseLsn } from '../../src/db/wal-position.js'

const SEGMENT = 16n * 1024n * 1024n
const PAGE = 8192n

t.test('a WAL position reads as one number from its two hexadecimal halves', async (t) => {
  t.equal(parseLsn('0/0'), 0n)
  t.equal(parseLsn('0/3000028'), 0x3000028n)
  t.equal(parseLsn('1/0'), 1n << 32n)
  t.equal(parseLsn('16/B374D848'), (0x16n << 32n) | 0xB374D848n)
  t.ok(parseLsn('1/0') > parseLsn('0/FFFFFFFF'), 'the high half orders first')
})

t.test('an insert position just past a page header is where replay stops: the page start', async (t) => {
  t.equal(normalizePosition(0x3000028n, SEGMENT, PAGE), 0x3000000n, 'past a segment\'s long header (40 bytes)')
  t.equal(normalizePosition(0x3002018n, SEGMENT, PAGE), 0x3002000n, 'past a page\'s short header (24 bytes)')
  t.equal(normalizePosition((1n << 32n) + 40n, SEGMENT, PAGE), 1n << 32n, 'in the high half too')
  t.equal(normalizePosition(0x3000000n, SEGMENT, PAGE), 0x3000000n, 'a page start stays')
  t.equal(normalizePosition(0x3016B90n, SEGMENT, PAGE), 0x3016B90n, 'a position inside a page stays')
  t.equal(normalizePosition(0x3002028n, SEGMENT, PAGE), 0x3002028n, '40 bytes into a page that starts no segment stays')
})
