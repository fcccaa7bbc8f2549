import t from 'tap'
import { createKeysRepository } from '../../../src/modules/keys/keys.repository.js'
import { guardedLookup } from '../../../src/modules/webhooks/webhook-target.js'
import { build } from '../../helper.js'

// Registering, listing and deleting webhooks, and where they may point (API.md §9). Nothing
// here delivers: the one webhook with a public address is made for a user whose feed stays
// empty, and deleted at once.

t.test('a webhook\'s secret is shown once; the list never shows it; delete answers 204, then 404', async (t) => {
  const { as } = await build(t, { env: { WEBHOOK_ALLOW_PRIVATE: 'true' } })
  const alice = await as('alice')
  const created = await alice.post('/v2/webhooks', { url: 'http://127.0.0.1:9/hook', events: ['message.received', 'message.status'] })
  t.equal(created.statusCode, 200, created.body)
  const hook = created.json()
  t.match(hook, { id: /^whk_[0-9a-z]{26}$/, url: 'http://127.0.0.1:9/hook', events: ['message.received', 'message.status'], secret: /^whsec_[A-Za-z0-9_-]{43}$/, disabledAt: null })
  t.ok(Date.parse(hook.createdAt) > 0)

  const listed = await alice.get('/v2/webhooks')
  t.equal(listed.statusCode, 200)
  t.same(listed.json().webhooks.map((w: { id: string }) => w.id), [hook.id])
  t.notOk('secret' in listed.json().webhooks[0], 'no secret in the list')
  t.notMatch(listed.body, hook.secret)

  const everything = await alice.post('/v2/webhooks', { url: 'http://127.0.0.1:9/all' })
  t.equal(everything.json().events, null, 'no filter: every type')

  const bob = await as('bob')
  t.equal((await bob.get('/v2/webhooks')).json().webhooks.length, 0, 'bob sees none of alice\'s')
  t.equal((await bob.delete(`/v2/webhooks/${hook.id}`)).statusCode, 404, 'nor can he delete one')
  t.equal((await bob.get(`/v2/webhooks/${hook.id}/deliveries`)).statusCode, 404, 'nor read its log')

  t.equal((await alice.delete(`/v2/webhooks/${hook.id}`)).statusCode, 204)
  const again = await alice.delete(`/v2/webhooks/${hook.id}`)
  t.equal(again.statusCode, 404)
  t.match(again.json(), { code: 'NOT_FOUND', message: `webhook ${hook.id} not found` })
})

t.test('bad webhooks are refused with a message naming the field', async (t) => {
  const { as } = await build(t, { env: { WEBHOOK_ALLOW_PRIVATE: 'true' } })
  const alice = await as('alice')
  const cases: [unknown, RegExp][] = [
    [{}, /url/],
    [{ url: 'not a url' }, /url: not an absolute URL/],
    [{ url: 'ftp://127.0.0.1/x' }, /url: must be https:\/\/ or http:\/\//],
    [{ url: 'http://user:pw@127.0.0.1/x' }, /url: must not carry credentials/],
    [{ url: `http://127.0.0.1/${'a'.repeat(2100)}` }, /url/],
    [{ url: 'http://127.0.0.1/x', events: ['message.sent'] }, /events/],
    [{ url: 'http://127.0.0.1/x', events: [] }, /events/],
    [{ url: 'http://127.0.0.1/x', events: ['message.status', 'message.status'] }, /events/]
  ]
  for (const [body, message] of cases) {
    const res = await alice.post('/v2/webhooks', body as Record<string, unknown>)
    t.equal(res.statusCode, 400, JSON.stringify(body).slice(0, 80))
    t.match(res.json(), { code: 'VALIDATION_FAILED', message })
  }
  t.equal((await alice.get('/v2/webhooks')).json().webhooks.length, 0, 'none was made')
})

t.test('at most 10 webhooks a user: the eleventh is a 409', async (t) => {
  const { as } = await build(t, { env: { WEBHOOK_ALLOW_PRIVATE: 'true' } })
  const alice = await as('alice')
  const answers = await Promise.all(Array.from({ length: 12 }, (_, i) => alice.post('/v2/webhooks', { url: `http://127.0.0.1:9/${i}` })))
  t.same(answers.map((a) => a.statusCode).sort(), [...Array(10).fill(200), 409, 409], 'twelve at once: ten made, two refused')
  t.match(answers.find((a) => a.statusCode === 409)!.json(), { code: 'CONFLICT', message: /alice already has 10 webhooks/ })
})

const SEALED = { WEBHOOK_SECRETS_KEY: 'ab'.repeat(32), RATE_LIMIT_PER_SECOND: '1000' }

t.test('without WEBHOOK_SECRETS_KEY (and not in development) webhooks are refused with a 503 that says why', async (t) => {
  const { as } = await build(t)
  const alice = await as('alice')
  const res = await alice.post('/v2/webhooks', { url: 'https://93.184.215.14/hook' })
  t.equal(res.statusCode, 503)
  t.match(res.json(), { code: 'UNAVAILABLE', message: /operator must set WEBHOOK_SECRETS_KEY/ })
  t.equal((await alice.get('/v2/webhooks')).json().webhooks.length, 0)
})

t.test('SSRF: without WEBHOOK_ALLOW_PRIVATE, only https to a public address', async (t) => {
  const { as } = await build(t, { env: SEALED })
  const mallory = await as('mallory')
  const refused: [string, RegExp][] = [
    ['http://93.184.215.14/hook', /url: must be https:\/\/ \(http:\/\/ only with WEBHOOK_ALLOW_PRIVATE=true\)/],
    ['https://127.0.0.1/hook', /url: 127\.0\.0\.1 is a non-public address \(private, loopback, link-local or reserved; allowed only with WEBHOOK_ALLOW_PRIVATE=true\)/],
    ['https://127.9.9.9:8443/hook', /loopback/],
    ['https://10.0.0.1/hook', /10\.0\.0\.1/],
    ['https://10.255.255.254/hook', /private/],
    ['https://172.16.5.4/hook', /private/],
    ['https://192.168.1.1/hook', /private/],
    ['https://169.254.169.254/latest/meta-data/', /169\.254\.169\.254/],
    ['https://100.64.0.1/hook', /private/],
    ['https://0.0.0.0/hook', /private/],
    ['https://[::1]/hook', /::1/],
    ['https://[fe80::1]/hook', /private/],
    ['https://[fd00::1]/hook', /private/],
    ['https://[::ffff:127.0.0.1]/hook', /private/],
    ['https://[::ffff:a9fe:a9fe]/hook', /private/],
    ['https://[::7f00:1]/hook', /private/],
    ['https://[64:ff9b:1::a9fe:a9fe]/hook', /private/],
    ['https://[64:ff9b::a00:1]/hook', /private/],
    ['https://[2002:7f00:1::1]/hook', /private/],
    ['https://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/hook', /private/],
    ['https://localhost/hook', /^url: localhost resolves to a non-public address \(private, loopback, link-local or reserved; allowed only with WEBHOOK_ALLOW_PRIVATE=true\)$/],
    ['https://2130706433/hook', /private/],
    // IANA special-purpose blocks that are not globally reachable, missed before.
    ['https://[::ffff:0:a00:1]/hook', /non-public/], // IPv4-translated ::ffff:0:0:0/96 (10.0.0.1)
    ['https://[::ffff:0:7f00:1]/hook', /non-public/], // IPv4-translated 127.0.0.1
    ['https://[5f00::1]/hook', /non-public/], // SRv6 SIDs
    ['https://[5fff:ffff::1]/hook', /non-public/],
    ['https://192.88.99.1/hook', /non-public/], // deprecated 6to4 relay anycast
    ['https://192.0.0.170/hook', /non-public/], // NAT64 discovery
    ['https://255.255.255.255/hook', /non-public/],
    ['https://[3fff::1]/hook', /non-public/], // documentation (RFC 9637)
    ['https://[2001:2::1]/hook', /non-public/], // benchmarking
    ['https://[2001:20::1]/hook', /non-public/], // ORCHIDv2
    ['https://[100:0:0:1::1]/hook', /non-public/], // dummy prefix
    ['https://[4000::1]/hook', /non-public/], // outside global unicast
    ['https://[::]/hook', /non-public/]
  ]
  for (const [url, message] of refused) {
    const res = await mallory.post('/v2/webhooks', { url })
    t.equal(res.statusCode, 400, url)
    t.match(res.json(), { code: 'VALIDATION_FAILED', message }, url)
    if (url.includes('localhost')) t.notMatch(res.json().message, /127\.0\.0\.1|::1/, 'a name\'s refusal does not tell what it resolves to')
  }
  t.equal((await mallory.get('/v2/webhooks')).json().webhooks.length, 0, 'none was made')

  // A public address is accepted (this user's feed is empty, so nothing is ever sent to it).
  for (const url of ['https://93.184.215.14/hook', 'https://[2606:4700:4700::1111]/hook', 'https://192.88.100.1/hook']) {
    const made = await mallory.post('/v2/webhooks', { url })
    t.equal(made.statusCode, 200, `${url}: ${made.body}`)
    t.equal((await mallory.delete(`/v2/webhooks/${made.json().id}`)).statusCode, 204)
  }
})

t.test('webhooks take the read scope: a read-only key manages them, a send-only key may not', async (t) => {
  const { db, createUser, callerFor } = await build(t, { env: { WEBHOOK_ALLOW_PRIVATE: 'true' } })
  await createUser('alice')
  const keys = createKeysRepository(db)
  const reader = callerFor('alice', await keys.create('alice', null, { scopes: ['read'] }))
  const sender = callerFor('alice', await keys.create('alice', null, { scopes: ['send'] }))
  const made = await reader.post('/v2/webhooks', { url: 'http://127.0.0.1:9/hook' })
  t.equal(made.statusCode, 200, made.body)
  const refused = await sender.post('/v2/webhooks', { url: 'http://127.0.0.1:9/hook' })
  t.equal(refused.statusCode, 403)
  t.match(refused.json(), { code: 'FORBIDDEN', message: /read scope/ })
  t.equal((await sender.get('/v2/webhooks')).statusCode, 403)
  t.equal((await reader.delete(`/v2/webhooks/${made.json().id}`)).statusCode, 204)
})

t.test('at delivery, a name that resolves to a non-public address is refused without telling the address', async (t) => {
  const lookup = guardedLookup(false)
  const err = await new Promise<NodeJS.ErrnoException | null>((resolve) => lookup('localhost', { all: true }, (e) => resolve(e)))
  t.equal(err?.message, 'localhost resolves to a non-public address', 'what the owner reads in the delivery log')
})
