import { connect } from 'node:net'
import fc from 'fast-check'
import t from 'tap'
import { build } from '../helper.js'

/**
 * Hostile input, property-based: every /v2 route gets generated paths, queries, headers and
 * bodies in every content type. The invariant: no answer is a 5xx, every error answer has the
 * contract's body, nothing hangs, and the service answers a normal request afterwards.
 */

const ROUTES: [method: 'GET' | 'POST' | 'DELETE', template: string][] = [
  ['GET', '/v2/events'], ['DELETE', '/v2/events'], ['POST', '/v2/events/ack'],
  ['GET', '/v2/user/:user'], ['GET', '/v2/whoami'],
  ['POST', '/v2/group'], ['GET', '/v2/group/:group'], ['POST', '/v2/group/:group'], ['DELETE', '/v2/group/:group'],
  ['POST', '/v2/group/:group/members'], ['POST', '/v2/group/:group/members/remove'],
  ['POST', '/v2/message'], ['GET', '/v2/message/:message'], ['DELETE', '/v2/message/:message'],
  ['GET', '/v2/message/:message/attachment/:n'], ['GET', '/v2/message/:message/status'],
  ['POST', '/v2/message/status'], ['POST', '/v2/message/typing'], ['DELETE', '/v2/message/typing/:recipient'],
  ['GET', '/v2/metadata/:entity'], ['POST', '/v2/metadata/:entity'],
  ['GET', '/v2/roster'], ['POST', '/v2/roster'], ['DELETE', '/v2/roster/:entity'],
  ['POST', '/v2/search'], ['GET', '/v2/conversations']
]

const CODES = ['UNAUTHORIZED', 'FORBIDDEN', 'NOT_FOUND', 'VALIDATION_FAILED', 'UNSUPPORTED_MEDIA_TYPE', 'PAYLOAD_TOO_LARGE',
  'RATE_LIMITED', 'QUOTA_EXCEEDED', 'IDEMPOTENCY_MISMATCH', 'IDEMPOTENCY_IN_PROGRESS']

const FIELDS = ['recipient', 'body', 'members', 'name', 'ids', 'upTo', 'status', 'message', 'metadata', 'entity',
  'query', 'types', 'cursor', 'limit', 'displayName', 'attachment', '__proto__', 'constructor', 'prototype', '']

/** Strings that have broken parsers, query languages and file systems before. */
const NASTY = [
  '', ' ', '\u0000', 'a\u0000b', '..', '../../etc/passwd', '%', '%00', '%ff', '%zz', '\\', "'", '"', '`',
  "' OR 1=1 --", '); DROP TABLE users; --', '*', ':*', 'a & b | !c', 'a <-> b', '!(x)', "'a':*", '%_%', '\\%', '_',
  '__proto__', 'constructor', 'prototype', 'toString', 'hasOwnProperty', '😀', '\u202e', '\ud800', '\uffff',
  'msg_00000000000000000000000000', 'grp_00000000000000000000000000', 'alice', 'bob', 'testbot', 'sent', 'read',
  '-1', '0', '1e309', 'NaN', 'Infinity', '0x10', '9'.repeat(400), 'x'.repeat(101), 'x'.repeat(10_001), '<script>alert(1)</script>',
  // Lone surrogates anywhere in a string (#14.2).
  'a\ud800b', '\udc00', 'x\udbff', '\udfff\ud800',
  // Forged search cursors (#14.3): base64 of cursors this service never wrote.
  ...[{ t: 'messages', k: ['not-a-date', 'x'] }, { t: 'messages', k: [] }, { t: 'users', k: ['a\u0000b'] }, { t: 'groups', k: [1, 2] },
    { t: 'nope' }, { t: 'messages', k: ['2026-11-21T10:00:00.000Z', 'msg_' + 'z'.repeat(500)] }, null, []]
    .map((c) => Buffer.from(JSON.stringify(c)).toString('base64url')),
  // What users type into search (#14.5): addresses, host and file names, paths, decimals.
  'alice@example.org', 'report.pdf', 'files.example.net', '/pub/v2', '3.14', 'C:\\x', 'a.b.c.d.e', '@', '.', '..pdf'
]

const nasty = fc.constantFrom(...NASTY)
const text = fc.oneof(nasty, fc.string({ maxLength: 30 }), fc.string({ unit: 'binary', maxLength: 30 }))

/** URI-encodes where it can; a lone surrogate goes in as its (invalid) UTF-8 escape. */
function encode (value: string): string {
  try {
    return encodeURIComponent(value)
  } catch {
    return '%ED%A0%80'
  }
}

const segment = fc.oneof(
  text.map(encode),
  fc.constantFrom('..', '.', '%2e%2e', '..%2f..%2fetc%2fpasswd', '%00', 'a%00b', '%ff', '%', '%zz', '%2F', 'x'.repeat(5000), '1', '0', '-1', '11')
)

const queryString = fc.array(fc.tuple(
  fc.constantFrom('after', 'limit', 'wait', 'upTo', 'for', 'q', '__proto__', 'constructor[prototype][x]', 'a[]', ''),
  fc.oneof(text.map(encode), fc.constantFrom('%', '%zz', '-1', '31', '1e3', '0x1', '1.5', 'abc', '9'.repeat(400)))
), { maxLength: 4 }).map((pairs) => pairs.length === 0 ? '' : `?${pairs.map(([k, v]) => `${k}=${v}`).join('&')}`)

const deep = (depth: number) => '['.repeat(depth) + ']'.repeat(depth)
const deepObject = (depth: number) => '{"a":'.repeat(depth) + '1' + '}'.repeat(depth)

const value: fc.Arbitrary<unknown> = fc.oneof(
  text, fc.jsonValue({ maxDepth: 3 }), fc.array(text, { maxLength: 5 }), fc.integer(), fc.double(),
  fc.constantFrom(null, true, [], {}, { __proto__: { polluted: true } }, ['alice', 'bob'], 'x'.repeat(200_000))
)

/** A JSON object written by hand, so keys like __proto__ reach the wire as own keys. */
const jsonObject = fc.array(fc.tuple(fc.constantFrom(...FIELDS), value), { maxLength: 6 })
  .map((entries) => `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${JSON.stringify(v) ?? 'null'}`).join(',')}}`)

interface Payload { contentType?: string, body?: string | Buffer }

const json: fc.Arbitrary<Payload> = fc.oneof(
  jsonObject.map((body) => ({ contentType: 'application/json', body })),
  fc.constantFrom<Payload>(
    { contentType: 'application/json', body: '{' }, { contentType: 'application/json', body: '' },
    { contentType: 'application/json', body: 'null' }, { contentType: 'application/json', body: '[]' },
    { contentType: 'application/json', body: '"x"' }, { contentType: 'application/json', body: '1' },
    { contentType: 'application/json', body: deep(50_000) }, { contentType: 'application/json', body: deepObject(5_000) },
    { contentType: 'application/json', body: `{"metadata":${deepObject(3_000)}}` }, { contentType: 'application/json', body: `{"members":${deep(3_000)}}` },
    { contentType: 'application/json', body: Buffer.from([0x7b, 0x22, 0x62, 0x6f, 0x64, 0x79, 0x22, 0x3a, 0x22, 0xff, 0xfe, 0xc0, 0x22, 0x7d]) },
    { contentType: 'application/json', body: '\ufeff{"body":"bom"}' },
    { contentType: 'application/json', body: `{"body":"${'x'.repeat(1_100_000)}"}` },
    { contentType: 'application/json; charset=utf-16', body: '{}' },
    { contentType: 'application/json', body: '{"__proto__":{"isAdmin":true},"constructor":{"prototype":{"x":1}}}' }
  )
)

const form: fc.Arbitrary<Payload> = fc.array(fc.tuple(fc.constantFrom(...FIELDS), fc.oneof(text.map(encode), fc.constantFrom('%', '%zz', '%00', 'a=b=c', '&&'))), { maxLength: 6 })
  .map((pairs) => ({ contentType: 'application/x-www-form-urlencoded', body: pairs.map(([k, v]) => `${encode(k)}=${v}`).join('&') }))

interface Part { name: string, filename?: string, type?: string, data: string }
const part: fc.Arbitrary<Part> = fc.record({
  name: fc.oneof(fc.constantFrom(...FIELDS), text),
  filename: fc.option(fc.oneof(text, fc.constantFrom('../../etc/passwd', 'a\u0000.png', 'x'.repeat(2000))), { nil: undefined }),
  type: fc.option(fc.constantFrom('image/png', 'text/html', 'application/octet-stream', '../x', 'a/b; c=d', ''), { nil: undefined }),
  data: fc.oneof(text, fc.constantFrom('x'.repeat(100_000)))
}, { requiredKeys: ['name', 'data'] })

const multipart: fc.Arbitrary<Payload> = fc.tuple(fc.array(part, { maxLength: 5 }), fc.constantFrom('whole', 'unclosed', 'wrong-boundary', 'no-boundary', 'garbage', 'no-headers'))
  .map(([parts, shape]) => {
    const boundary = 'parleyBoundary7MA4YWxk'
    const bodyOf = (p: Part) => {
      const disposition = `form-data; name="${p.name.replace(/"/g, '%22')}"${p.filename === undefined ? '' : `; filename="${p.filename.replace(/"/g, '%22')}"`}`
      const headers = shape === 'no-headers' ? '' : `Content-Disposition: ${disposition}\r\n${p.type === undefined ? '' : `Content-Type: ${p.type}\r\n`}`
      return `--${boundary}\r\n${headers}\r\n${p.data}\r\n`
    }
    const body = parts.map(bodyOf).join('') + (shape === 'unclosed' ? '' : `--${boundary}--\r\n`)
    switch (shape) {
      case 'wrong-boundary': return { contentType: 'multipart/form-data; boundary=somethingElse', body }
      case 'no-boundary': return { contentType: 'multipart/form-data', body }
      case 'garbage': return { contentType: `multipart/form-data; boundary=${boundary}`, body: `--${boundary}\r\n\u0000\u0001garbage` }
      default: return { contentType: `multipart/form-data; boundary=${boundary}`, body }
    }
  })

const other: fc.Arbitrary<Payload> = fc.record({
  contentType: fc.constantFrom('text/plain', 'application/xml', 'a/b/c', '', ';;;', 'application/x-www-form-urlencoded; charset=ebcdic', 'application/octet-stream'),
  body: text
})

const payload: fc.Arbitrary<Payload> = fc.oneof(json, json, form, multipart, other, fc.constant<Payload>({}))

const headers = fc.record({
  auth: fc.oneof({ arbitrary: fc.constant('owner'), weight: 12 }, fc.constantFrom('stranger', 'none', 'garbage', 'empty-secret', 'huge')),
  idempotencyKey: fc.option(fc.oneof(text, fc.constantFrom('x'.repeat(10_000))), { nil: undefined }),
  requestId: fc.option(text, { nil: undefined })
}, { requiredKeys: ['auth'] })

t.test('no generated request gets a 5xx, a malformed error or no answer', async (t) => {
  const { app, as } = await build(t, { env: { RATE_LIMIT_PER_SECOND: '1000000', DAILY_MESSAGE_QUOTA: '1000000' } })
  const alice = await as('alice')
  const bob = await as('bob')
  const group = (await alice.post('/v2/group', { name: 'ops', members: ['bob'] })).json() as { id: string }
  const form = new FormData()
  form.append('recipient', 'bob')
  form.append('body', 'with a file')
  form.append('attachment', new Blob(['hello']), 'hello.txt')
  const message = (await alice.post('/v2/message', form)).json() as { id: string }
  const real: Record<string, string[]> = {
    user: ['alice', 'bob', 'testbot'],
    group: [group.id],
    message: [message.id],
    n: ['1'],
    recipient: ['bob', group.id],
    entity: ['alice', group.id, message.id]
  }
  const authorization = (auth: string): string | undefined => {
    switch (auth) {
      case 'owner': return alice.authorization
      case 'stranger': return bob.authorization
      case 'garbage': return 'Basic !!!not-base64'
      case 'empty-secret': return `Basic ${Buffer.from(`${alice.keyId}:`).toString('base64')}`
      case 'huge': return `Basic ${'A'.repeat(8_000)}`
      default: return undefined
    }
  }

  for (const [method, template] of ROUTES) {
    const params = [...template.matchAll(/:([a-z]+)/g)].map((m) => m[1]!)
    const pathArb = fc.tuple(...params.map((name) => fc.oneof(segment, fc.constantFrom(...real[name]!))))
      .map((values) => params.reduce((path, name, i) => path.replace(`:${name}`, values[i]!), template))
    const request = fc.record({ path: pathArb, query: queryString, payload, headers })

    await t.test(`${method} ${template}`, async (t) => {
      let runs = 0
      const statuses = new Map<number, number>()
      const outcome = await fc.check(fc.asyncProperty(request, async ({ path, query, payload, headers }) => {
        runs++
        const auth = authorization(headers.auth)
        const res = await Promise.race([
          app.inject({
            method,
            url: path + query,
            headers: {
              ...(auth === undefined ? {} : { authorization: auth }),
              ...(payload.contentType === undefined ? {} : { 'content-type': payload.contentType }),
              ...(headers.idempotencyKey === undefined ? {} : { 'idempotency-key': encode(headers.idempotencyKey) }),
              ...(headers.requestId === undefined ? {} : { 'x-request-id': encode(headers.requestId) })
            },
            ...(payload.body === undefined ? {} : { payload: payload.body })
          }),
          new Promise<never>((_resolve, reject) => setTimeout(() => reject(new Error(`no answer within 10 s: ${method} ${path}${query}`)), 10_000).unref())
        ])
        statuses.set(res.statusCode, (statuses.get(res.statusCode) ?? 0) + 1)
        const where = `${method} ${(path + query).slice(0, 200)} [${payload.contentType ?? 'no type'}]`
        if (res.statusCode >= 500) throw new Error(`${where} answered ${res.statusCode}: ${res.body.slice(0, 300)}`)
        if (res.statusCode >= 400) {
          const error = JSON.parse(res.body) as Record<string, unknown>
          const shaped = error.statusCode === res.statusCode && typeof error.error === 'string' &&
            typeof error.message === 'string' && error.message !== '' && CODES.includes(error.code as string)
          if (!shaped) throw new Error(`${where} answered ${res.statusCode} with a body out of contract: ${res.body.slice(0, 300)}`)
        }
        // PGlite answers in microtasks: let timers (the deadline above) run between requests.
        await new Promise((resolve) => setImmediate(resolve))
      }), { numRuns: 100 })
      if (outcome.failed) {
        const example = JSON.stringify(outcome.counterexample)?.slice(0, 600) ?? ''
        const reason = `${String(outcome.errorInstance).slice(0, 600)} on ${example} (seed ${outcome.seed}, path ${outcome.counterexamplePath ?? ''})`
        t.fail(reason)
      }
      t.comment(`answers: ${[...statuses].sort(([a], [b]) => a - b).map(([status, n]) => `${n}× ${status}`).join(', ')}`)
      const after = await bob.get('/v2/user/alice')
      t.equal(after.statusCode, 200, `the service still answers after ${runs} hostile requests`)
    })
  }
})

t.test('hostile bytes on the wire: the HTTP layer refuses them and the server lives on', async (t) => {
  const { app, as } = await build(t)
  const alice = await as('alice')
  await app.listen({ host: '127.0.0.1', port: 0 })
  const { port } = app.server.address() as { port: number }

  /** Writes raw bytes and reads until the server closes or 5 s pass; resolves with the status line. */
  const raw = (bytes: string | Buffer) => new Promise<string>((resolve, reject) => {
    const socket = connect(port, '127.0.0.1')
    let answer = ''
    const timer = setTimeout(() => { socket.destroy(); reject(new Error(`no answer to ${bytes.toString().slice(0, 80)}`)) }, 5_000)
    socket.on('connect', () => socket.write(bytes))
    socket.on('data', (chunk) => {
      answer += chunk.toString('latin1')
      if (/\r\n\r\n/.test(answer)) { clearTimeout(timer); socket.destroy(); resolve(answer.split('\r\n')[0]!) }
    })
    socket.on('error', () => {})
    socket.on('close', () => { clearTimeout(timer); resolve(answer.split('\r\n')[0] ?? '') })
  })
  const auth = `Authorization: ${alice.authorization}\r\n`
  // What Node's parser refuses is answered in the contract's shape too (server-options.ts).
  for (const [name, bytes, status] of [
    ['headers too large', `GET /v2/user/alice HTTP/1.1\r\nHost: x\r\n${auth}X-Big: ${'a'.repeat(100_000)}\r\n\r\n`, 431],
    ['a broken chunked body', `POST /v2/message HTTP/1.1\r\nHost: x\r\n${auth}Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n`, 400]
  ] as const) {
    const answer = await new Promise<string>((resolve) => {
      const socket = connect(port, '127.0.0.1')
      let text = ''
      socket.on('connect', () => socket.write(bytes))
      socket.on('data', (chunk) => { text += chunk.toString('latin1') })
      socket.on('error', () => {})
      socket.on('close', () => resolve(text))
    })
    const error = JSON.parse(answer.slice(answer.indexOf('\r\n\r\n') + 4)) as Record<string, unknown>
    t.match(error, { statusCode: status, code: 'VALIDATION_FAILED', message: String }, `${name}: ${status} with a JSON error body`)
  }
  const stalling = `--b0undary\r\n\r\n${'x'.repeat(100_000)}\r\n--b0undary--\r\n`
  const cases: [string, string | Buffer, RegExp][] = [
    ['a 100 KB header', `GET /v2/user/alice HTTP/1.1\r\nHost: x\r\n${auth}X-Big: ${'a'.repeat(100_000)}\r\n\r\n`, /^HTTP\/1\.1 431/],
    ['5,000 small headers', `GET /v2/user/alice HTTP/1.1\r\nHost: x\r\n${auth}${'X-A: b\r\n'.repeat(5_000)}\r\n`, /^HTTP\/1\.1 431/],
    ['an unnormalised ../ path', `GET /v2/user/../../../etc/passwd HTTP/1.1\r\nHost: x\r\n${auth}\r\n`, /^HTTP\/1\.1 404/],
    ['a NUL in the path', `GET /v2/user/al%00ice HTTP/1.1\r\nHost: x\r\n${auth}\r\n`, /^HTTP\/1\.1 (400|404)/],
    ['raw bytes 0xff in the path', Buffer.concat([Buffer.from('GET /v2/user/'), Buffer.from([0xff, 0xfe]), Buffer.from(` HTTP/1.1\r\nHost: x\r\n${auth}\r\n`)]), /^HTTP\/1\.1 400/],
    ['a broken chunked body', `POST /v2/message HTTP/1.1\r\nHost: x\r\n${auth}Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n`, /^HTTP\/1\.1 400/],
    ['Content-Length and chunked together', `POST /v2/message HTTP/1.1\r\nHost: x\r\n${auth}Content-Type: application/json\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n`, /^HTTP\/1\.1 400/],
    ['a body longer than the limit announced up front', `POST /v2/roster HTTP/1.1\r\nHost: x\r\n${auth}Content-Type: application/json\r\nContent-Length: 50000000\r\n\r\n{`, /^HTTP\/1\.1 413/],
    ['a multipart part whose headers never end', `POST /v2/message HTTP/1.1\r\nHost: x\r\n${auth}Content-Type: multipart/form-data; boundary=b0undary\r\nContent-Length: ${stalling.length}\r\n\r\n${stalling}`, /^HTTP\/1\.1 400/],
    ['not HTTP at all', '\u0016\u0003\u0001\u0002\u0000\u0001\u0000\u01fc\u0003\u0003', /^(HTTP\/1\.1 400 Bad Request|)$/]
  ]
  for (const [name, bytes, expected] of cases) {
    t.match(await raw(bytes), expected, name)
  }
  const res = await fetch(`http://127.0.0.1:${port}/v2/user/alice`, { headers: { authorization: alice.authorization } })
  t.equal(res.status, 200, 'a normal request afterwards')
})
