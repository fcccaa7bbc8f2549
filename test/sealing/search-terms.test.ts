import { hash, hkdfSync } from 'node:crypto'
import t from 'tap'
import { installKeyring, Keyring, parseSealingKeys } from '../../src/sealing/keyring.js'
import { bodySearchHashes, querySearchHashes } from '../../src/sealing/search-terms.js'

/**
 * The search hashes a database holds must stay what they were: a change in how they are
 * computed, however equivalent it looks, would leave every stored message unfindable. So they
 * are computed here from their definition (docs/security.md): the search key derived from the
 * configured one with HKDF-SHA-256 ("parley search v1"), then each term's SHA-256 over that key
 * as hex and the term, its first 32 bits as a signed integer.
 */
const SECRET = 'a1'.repeat(32)
const searchKey = Buffer.from(hkdfSync('sha256', Buffer.from(SECRET, 'hex'), Buffer.alloc(0), 'parley search v1', 32)).toString('hex')
const defined = (term: string) => parseInt(hash('sha256', searchKey + term, 'hex').slice(0, 8), 16) | 0

t.test('a body\'s hashes are its words and their prefixes from 2 characters (short words here), each as defined', async (t) => {
  installKeyring(new Keyring(parseSealingKeys(`k1:${SECRET}`)))
  const terms = ['hello', 'he', 'hel', 'hell', 'wörld', 'wö', 'wör', 'wörl', 'a', '𝒳y', '3', '14']
  const stored = bodySearchHashes('Hello, wörld! a 𝒳y 3.14').slice(1, -1).split(',').map(Number)
  t.same(stored.sort(), terms.map(defined).sort())
  t.ok(stored.some((h) => h < 0) && stored.some((h) => h > 0), 'both signs occur: the top bit is the sign')
  t.same(querySearchHashes(['hello', 'wörld']), [`{${defined('hello')},${defined('wörld')}}`])
})

t.test('a word is hashed whole up to 12 characters; a longer one by its prefixes up to 12, which a query of it looks up', async (t) => {
  installKeyring(new Keyring(parseSealingKeys(`k1:${SECRET}`)))
  // Prefixes by characters (code points), from 2 to `to`.
  const prefixes = (word: string, to: number) => Array.from({ length: to - 1 }, (_, i) => Array.from(word).slice(0, i + 2).join(''))
  const twelve = 'abcdefghijkl'
  const long = 'internationalization'
  const astral = '𝒳bcdefghijklm' // 13 characters, 14 UTF-16 units
  const terms = [...prefixes(twelve, 12), ...prefixes(long, 12), ...prefixes(astral, 12)]
  t.ok(terms.includes(twelve) && !terms.includes(long) && !terms.includes(astral), 'the 12-character word whole, the longer ones not')
  t.equal(prefixes(astral, 12).at(-1), '𝒳bcdefghijkl', 'prefixes count characters, not UTF-16 units')
  const stored = bodySearchHashes(`${twelve} ${long} ${astral}`).slice(1, -1).split(',').map(Number)
  t.same(stored.sort(), terms.map(defined).sort(), 'the stored hashes are those terms\' and no others')
  t.same(querySearchHashes([long]), [`{${defined('internationa')}}`], 'a query of the long word asks for its first 12')
  t.ok(stored.includes(defined('internationa')) && stored.includes(defined('𝒳bcdefghijkl')), 'and the body holds what such a query asks for')
})
