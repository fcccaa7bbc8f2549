import { execFile } from 'node:child_process'
import { copyFileSync, readFileSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { promisify } from 'node:util'
import t from 'tap'
import { createParleyClient } from '../src/client/index.js'
import { clientTypes, SCHEMA_FILE } from '../src/client/generate.js'
import { build } from './helper.js'
import { tempDir } from './support/processes.js'

t.test('the OpenAPI document passes redocly lint (recommended rules) with no error and no warning', async (t) => {
  const { app } = await build(t)
  const dir = tempDir(t)
  writeFileSync(join(dir, 'openapi.json'), JSON.stringify(app.swagger()))
  copyFileSync('.redocly.lint-ignore.yaml', join(dir, '.redocly.lint-ignore.yaml'))
  const bin = join(process.cwd(), 'node_modules', '.bin', 'redocly')
  const run = await promisify(execFile)(bin, ['lint', 'openapi.json', '--format=stylish'], { cwd: dir, env: { ...process.env, NO_COLOR: '1', REDOCLY_TELEMETRY: 'off' } })
    .then(({ stdout, stderr }) => ({ code: 0, out: stdout + stderr }), (err: { code: number, stdout: string, stderr: string }) => ({ code: err.code, out: err.stdout + err.stderr }))
  t.equal(run.code, 0, run.code === 0 ? 'redocly lint exits 0' : run.out)
  t.match(run.out, /Your API description is valid/)
  t.notMatch(run.out, /^\s*\d+:\d+\s+(warning|error)\s/m, 'no problem reported')
  t.notMatch(run.out, /You have \d+ warning/)
})

t.test('every operation has an operationId; shared objects are components; errors enumerate their codes', async (t) => {
  const { app } = await build(t)
  const doc = app.swagger() as { paths: Record<string, Record<string, { operationId?: string, security?: unknown[] }>>, components: { schemas: Record<string, { properties?: Record<string, { enum?: string[] }> }> } }
  const ids = Object.values(doc.paths).flatMap((methods) => Object.values(methods).map((o) => o.operationId))
  t.notOk(ids.includes(undefined), 'an operationId everywhere')
  t.equal(new Set(ids).size, ids.length, 'each unique')
  for (const name of ['Message', 'Group', 'User', 'Event', 'Error', 'MessageReceivedEvent', 'TypingStartedEvent']) t.ok(doc.components.schemas[name], `components.schemas.${name}`)
  t.match(doc.components.schemas.Error?.properties?.code?.enum, ['UNAUTHORIZED', 'FORBIDDEN', 'NOT_FOUND'])
  t.same(doc.paths['/healthz']?.get?.security, [], 'health needs no credentials')
  t.notOk(JSON.stringify(doc).includes('Default Response'))
})

t.test('src/client/schema.ts is what the served document generates (npm run client:generate)', async (t) => {
  const { app } = await build(t)
  const current = readFileSync(SCHEMA_FILE, 'utf8')
  t.ok(current === await clientTypes(app.swagger()), 'schema.ts is stale: run `npm run client:generate` and commit it')
})

t.test('the typed client sends a multipart message with an attachment and reads it back', async (t) => {
  const { app, as } = await build(t)
  await app.listen({ port: 0, host: '127.0.0.1' })
  const { port } = app.server.address() as { port: number }
  const alice = await as('alice')
  const bob = await as('bob')
  const client = createParleyClient({ baseUrl: `http://127.0.0.1:${port}`, keyId: alice.keyId, secret: alice.secret })

  const me = await client.GET('/v2/whoami')
  t.equal(me.data?.user.address, 'alice')
  const form = new FormData()
  form.append('recipient', 'bob')
  form.append('body', 'the plan')
  form.append('attachment', new Blob(['attack at dawn'], { type: 'text/plain' }), 'plan.txt')
  const sent = await client.POST('/v2/message', { body: {} as never, bodySerializer: () => form })
  t.equal(sent.response.status, 200)
  t.match(sent.data, { recipient: 'bob', body: 'the plan', attachments: [{ index: 1, filename: 'plan.txt', contentType: 'text/plain', size: 14 }] })

  const bobs = createParleyClient({ baseUrl: `http://127.0.0.1:${port}`, keyId: bob.keyId, secret: bob.secret })
  const file = await bobs.GET('/v2/message/{message}/attachment/{n}', { params: { path: { message: sent.data!.id, n: '1' } }, parseAs: 'text' })
  t.equal(file.data, 'attack at dawn')
  const feed = await bobs.GET('/v2/events', { params: { query: { after: '0' } } })
  const received = feed.data?.events.find((e) => e.type === 'message.received')
  t.equal(received?.type === 'message.received' ? received.data.message.id : undefined, sent.data!.id, 'events are a typed union')

  const refused = await client.POST('/v2/message', { body: { recipient: 'nobody', body: 'x' } })
  t.equal(refused.response.status, 404)
  t.equal(refused.error?.code, 'NOT_FOUND')
})
