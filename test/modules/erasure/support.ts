import { randomBytes } from 'node:crypto'
import { sql } from 'drizzle-orm'
import type { LightMyRequestResponse } from 'fastify'
import type { Db } from '../../../src/db/client.js'
import { queryRows } from '../../../src/db/rows.js'
import { createKeysRepository } from '../../../src/modules/keys/keys.repository.js'
import { build, type BuildOptions, type Caller, type TestContext } from '../../helper.js'
import { until } from '../../support/until.js'

/** Webhooks to loopback, and no rate limit in the way. */
const ENV = { WEBHOOK_ALLOW_PRIVATE: 'true', RATE_LIMIT_PER_SECOND: '100000' }

/** A word no test writes by chance: lower-case letters and digits, so search indexes it as one word. */
export function canary (): string {
  return `canary${randomBytes(8).toString('hex')}`
}

/** The app with an admin (root, a key with only the admin scope). */
export async function setUp (t: TestContext, options: BuildOptions = {}) {
  const built = await build(t, { ...options, env: { ...ENV, ...options.env } })
  await built.createUser('root')
  const admin = built.callerFor('root', await createKeysRepository(built.db).create('root', null, { scopes: ['admin'] }))
  /** GET /v2/admin/users/{address} as the admin, on `app` (this instance unless another is given). */
  const erasureOf = async (address: string, app = built.app): Promise<string | null> => {
    const res = await app.inject({ method: 'GET', url: `/v2/admin/users/${address}`, headers: { authorization: admin.authorization } })
    if (res.statusCode !== 200) throw new Error(`GET /v2/admin/users/${address} answered ${res.statusCode}: ${res.body}`)
    return res.json().erasure as string | null
  }
  /** Waits (bounded) until the erasure of `address` shows done. */
  const erased = async (address: string, app = built.app): Promise<void> => {
    await until(async () => await erasureOf(address, app) === 'done', { timeoutMs: 30_000, intervalMs: 100, message: `the erasure of ${address}` })
  }
  return { ...built, admin, erasureOf, erased }
}

/**
 * Every table of the public schema with a row whose text holds `needle` (as text, or its bytes
 * in hex: how a bytea column, attachment chunks, reads as text), read from information_schema
 * so that a table added later is scanned too.
 */
export async function tablesHolding (db: Db, needle: string): Promise<string[]> {
  const tables = await queryRows<{ name: string }>(db, sql`
    SELECT table_name AS name FROM information_schema.tables
    WHERE table_schema = 'public' AND table_type = 'BASE TABLE' ORDER BY 1`)
  const hex = Buffer.from(needle).toString('hex')
  const found: string[] = []
  for (const { name } of tables) {
    const [row] = await queryRows<{ n: number }>(db, sql`
      SELECT count(*)::int AS n FROM ${sql.identifier(name)} t WHERE strpos(lower(t::text), ${needle}) > 0 OR strpos(t::text, ${hex}) > 0`)
    if (row!.n > 0) found.push(name)
  }
  return found
}

/** How many rows of `table` (a fixed name from the test) have `column` = `value`. */
export async function rowsWhere (db: Db, table: string, column: string, value: string): Promise<number> {
  const [row] = await queryRows<{ n: number }>(db, sql`SELECT count(*)::int AS n FROM ${sql.identifier(table)} WHERE ${sql.identifier(column)} = ${value}`)
  return row!.n
}

/** A multipart send with one file. */
export function withFile (fields: Record<string, string>, file: { data: Buffer, type: string, filename: string }): FormData {
  const body = new FormData()
  for (const [name, value] of Object.entries(fields)) body.append(name, value)
  body.append('attachment', new Blob([new Uint8Array(file.data)], { type: file.type }), file.filename)
  return body
}

/** The answer's JSON, failing loudly (with the body) when the status is not `status`. */
export function ok (res: LightMyRequestResponse, status = 200): any {
  if (res.statusCode !== status) throw new Error(`expected ${status}, got ${res.statusCode}: ${res.body}`)
  return res.body === '' ? undefined : res.json()
}

/** `count` plain messages from `from` to `to`: their ids. */
export async function sendMany (from: Caller, to: string, count: number, body = 'note'): Promise<string[]> {
  const ids: string[] = []
  for (let i = 0; i < count; i++) ids.push(ok(await from.post('/v2/message', { recipient: to, body: `${body} ${i}` })).id)
  return ids
}
