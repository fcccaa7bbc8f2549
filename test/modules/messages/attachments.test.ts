import { createHash } from 'node:crypto'
import t from 'tap'
import { sql } from 'drizzle-orm'
import { queryRows } from '../../../src/db/rows.js'
import { openText, record } from '../../../src/sealing/records.js'
import { build } from '../../helper.js'
import { makePng } from '../../support/png.js'

function form (fields: Record<string, string>, files: { name?: string, data: Buffer, type: string, filename: string }[]): FormData {
  const body = new FormData()
  for (const [name, value] of Object.entries(fields)) body.append(name, value)
  for (const file of files) body.append(file.name ?? 'attachment', new Blob([new Uint8Array(file.data)], { type: file.type }), file.filename)
  return body
}

t.test('a PNG attachment round-trips byte for byte with its headers', async (t) => {
  const { as, db } = await build(t)
  const alice = await as('alice')
  const bob = await as('bob')
  const png = makePng(64, 64)
  const sent = await alice.post('/v2/message', form({ recipient: 'bob', body: 'a cat' }, [{ data: png, type: 'image/png', filename: 'cat.png' }]))
  t.equal(sent.statusCode, 200, sent.body)
  const message = sent.json()
  t.same(message.attachments, [{ index: 1, filename: 'cat.png', contentType: 'image/png', size: png.length }])

  for (const caller of [alice, bob]) {
    const res = await caller.get(`/v2/message/${message.id}/attachment/1`)
    t.equal(res.statusCode, 200)
    t.ok(res.rawPayload.equals(png), `${caller.address} gets the same bytes`)
    t.equal(res.headers['content-type'], 'image/png')
    t.equal(res.headers['content-length'], String(png.length))
    t.equal(res.headers['x-content-type-options'], 'nosniff')
    t.equal(res.headers['content-disposition'], 'attachment; filename="cat.png"; filename*=UTF-8\'\'cat.png')
  }
  const [stored] = await queryRows<{ sha256: string, sealed_by: string }>(db, sql`SELECT sha256, sealed_by FROM attachments WHERE message_id = ${message.id}`)
  const sha256 = createHash('sha256').update(png).digest('hex')
  t.not(stored!.sha256, sha256, 'its SHA-256 is not in the table as it is (it would confirm a guessed file)')
  t.equal(openText(stored!.sha256, record.attachmentSha256(message.id, 1), stored!.sealed_by), sha256, 'stored with its SHA-256, sealed')
  t.equal((await alice.get(`/v2/message/${message.id}/attachment/2`)).statusCode, 404)
  t.equal((await (await as('carol')).get(`/v2/message/${message.id}/attachment/1`)).statusCode, 403)
})

t.test('several attachments keep their order and types; an attachment alone needs no body', async (t) => {
  const { as } = await build(t)
  const alice = await as('alice')
  await as('bob')
  const res = await alice.post('/v2/message', form({ recipient: 'bob' }, [
    { data: Buffer.from('BEGIN:VCALENDAR\r\nEND:VCALENDAR\r\n'), type: 'text/calendar', filename: 'invite.ics' },
    { data: makePng(4, 4), type: 'image/png', filename: 'dot.png' },
    { data: Buffer.from('x'), type: 'not a type', filename: 'odd.bin' }
  ]))
  t.equal(res.statusCode, 200, res.body)
  t.match(res.json(), {
    body: '',
    attachments: [
      { index: 1, filename: 'invite.ics', contentType: 'text/calendar' },
      { index: 2, filename: 'dot.png', contentType: 'image/png' },
      { index: 3, filename: 'odd.bin', contentType: 'application/octet-stream' }
    ]
  })
  const third = await alice.get(`/v2/message/${res.json().id}/attachment/3`)
  t.equal(third.headers['content-type'], 'application/octet-stream', 'an invalid type is served as octet-stream')
})

t.test('a hostile filename cannot break out of Content-Disposition', async (t) => {
  const { as } = await build(t)
  const alice = await as('alice')
  await as('bob')
  const hostile = 'evil"; filename=x.html\r\nSet-Cookie: a=b; ü.png'
  const res = await alice.post('/v2/message', form({ recipient: 'bob', body: 'x' }, [{ data: Buffer.from('hi'), type: 'text/plain', filename: hostile }]))
  t.equal(res.statusCode, 200, res.body)
  const download = await alice.get(`/v2/message/${res.json().id}/attachment/1`)
  const header = download.headers['content-disposition'] as string
  t.notMatch(header, /[\r\n]/)
  t.equal(download.headers['set-cookie'], undefined)
  t.match(header, /^attachment; filename="[^"]*"; filename\*=UTF-8''[A-Za-z0-9%._~!-]+$/)
  t.equal((header.match(/"/g) ?? []).length, 2, 'only the two quotes of the fallback name')
  const encoded = /filename\*=UTF-8''(.*)$/.exec(header)![1]!
  t.equal(decodeURIComponent(encoded), res.json().attachments[0].filename, 'the exact stored name survives in filename*')

  const traversal = await alice.post('/v2/message', form({ recipient: 'bob', body: 'x' }, [{ data: Buffer.from('hi'), type: 'text/plain', filename: '../../etc/passwd' }]))
  t.equal(traversal.json().attachments[0].filename, 'passwd', 'no path survives')
})

t.test('an attachment over MAX_ATTACHMENT_BYTES answers 413 and leaves nothing behind', async (t) => {
  const { as, db } = await build(t, { env: { MAX_ATTACHMENT_BYTES: '1024' } })
  const alice = await as('alice')
  await as('bob')
  const res = await alice.post('/v2/message', form({ recipient: 'bob', body: 'big' }, [{ data: Buffer.alloc(1025, 7), type: 'application/octet-stream', filename: 'big.bin' }]))
  t.equal(res.statusCode, 413)
  t.match(res.json(), { statusCode: 413, code: 'PAYLOAD_TOO_LARGE', message: /attachment.*1024 bytes/ })
  const ok = await alice.post('/v2/message', form({ recipient: 'bob', body: 'fits' }, [{ data: Buffer.alloc(1024, 7), type: 'application/octet-stream', filename: 'ok.bin' }]))
  t.equal(ok.statusCode, 200)
  const [row] = await queryRows<{ messages: number, attachments: number, quota: number }>(db, sql`
    SELECT (SELECT count(*) FROM messages)::int AS messages, (SELECT count(*) FROM attachments)::int AS attachments,
           (SELECT coalesce(sum(count), 0) FROM quota_usage)::int AS quota`)
  t.same(row, { messages: 1, attachments: 1, quota: 1 }, 'only the send that fit')
})

t.test('more than MAX_ATTACHMENTS files answers 400 naming attachment', async (t) => {
  const { as } = await build(t, { env: { MAX_ATTACHMENTS: '2' } })
  const alice = await as('alice')
  await as('bob')
  const files = [1, 2, 3].map((i) => ({ data: Buffer.from(`f${i}`), type: 'text/plain', filename: `f${i}.txt` }))
  const res = await alice.post('/v2/message', form({ recipient: 'bob', body: 'x' }, files))
  t.equal(res.statusCode, 400)
  t.match(res.json(), { code: 'VALIDATION_FAILED', message: /attachment: at most 2 files/ })
})

t.test('a multipart body with a broken boundary answers 400, not 500', async (t) => {
  const { app, as } = await build(t)
  const alice = await as('alice')
  const res = await app.inject({
    method: 'POST',
    url: '/v2/message',
    headers: { authorization: alice.authorization, 'content-type': 'multipart/form-data; boundary=zzz' },
    payload: '--zzz\r\nContent-Disposition: form-data; name="recipient"\r\n\r\nbob\r\n--zz'
  })
  t.ok(res.statusCode >= 400 && res.statusCode < 500, `answered ${res.statusCode}`)
  t.match(res.json(), { code: String })
})
