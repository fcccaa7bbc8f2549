import { Writable } from 'node:stream'
import type { FastifyInstance, LightMyRequestResponse } from 'fastify'
import { buildApp, type AppOptions } from '../src/app.js'
import { loadConfig, type Config } from '../src/config.js'
import { connectPostgres, type Database, type Db } from '../src/db/client.js'
import { createKeysRepository } from '../src/modules/keys/keys.repository.js'
import { createUsersRepository } from '../src/modules/users/users.repository.js'
import { freshDatabase } from './support/databases.js'
import { TEST_SEALING_KEYS } from './support/sealing.js'

/** The slice of a tap test the helpers use. */
export interface TestContext {
  teardown(fn: () => unknown): void
}

type BodyFormat = 'json' | 'form' | 'multipart'

interface RequestOptions {
  headers?: Record<string, string>
  format?: BodyFormat
}

type Body = Record<string, unknown>

/** A client that calls the app as one API key, through `app.inject`. */
export interface Caller {
  address: string
  keyId: string
  secret: string
  authorization: string
  get(url: string, options?: RequestOptions): Promise<LightMyRequestResponse>
  delete(url: string, options?: RequestOptions): Promise<LightMyRequestResponse>
  post(url: string, body?: Body | FormData, options?: RequestOptions): Promise<LightMyRequestResponse>
  patch(url: string, body?: Body, options?: RequestOptions): Promise<LightMyRequestResponse>
  put(url: string, options?: RequestOptions): Promise<LightMyRequestResponse>
}

export function basic (keyId: string, secret: string): string {
  return `Basic ${Buffer.from(`${keyId}:${secret}`).toString('base64')}`
}

/** Encodes fields the three ways the service accepts; a list is a repeated field. */
function encodeBody (body: Body | FormData, format: BodyFormat): { payload: string | FormData, headers: Record<string, string> } {
  if (body instanceof FormData) return { payload: body, headers: {} }
  if (format === 'json') return { payload: JSON.stringify(body), headers: { 'content-type': 'application/json' } }
  const pairs: [string, string][] = []
  for (const [name, value] of Object.entries(body)) {
    for (const item of Array.isArray(value) ? value : [value]) {
      pairs.push([name, typeof item === 'string' ? item : JSON.stringify(item)])
    }
  }
  if (format === 'form') {
    return { payload: new URLSearchParams(pairs).toString(), headers: { 'content-type': 'application/x-www-form-urlencoded' } }
  }
  const form = new FormData()
  for (const [name, value] of pairs) form.append(name, value)
  return { payload: form, headers: {} }
}

export interface Built {
  /** The URL of this test's PostgreSQL database (undefined on PGlite). */
  url: string | undefined
  /**
   * Another instance of the service on the same database: on PostgreSQL with its own pool and
   * LISTEN connection, as a second process would have; on PGlite (one connection per process)
   * sharing this one.
   */
  secondInstance(env?: Record<string, string>, erasure?: AppOptions['erasure']): Promise<FastifyInstance>
  app: FastifyInstance
  database: Database
  db: Db
  config: Config
  /** Every log line the app wrote, as text. */
  logs(): string
  /** A caller for `address`: the user and a key are made on first use. */
  as(address: string, options?: { dailyQuota?: number }): Promise<Caller>
  createUser(address: string, displayName?: string): Promise<void>
  createKey(address: string, dailyQuota?: number | null): Promise<{ keyId: string, secret: string }>
  callerFor(address: string, key: { keyId: string, secret: string }): Caller
}

export interface BuildOptions {
  /** Environment variables on top of the defaults. */
  env?: Record<string, string>
  /** Extra routes, registered before the app is ready (to exercise plugins directly). */
  routes?: (app: FastifyInstance) => Promise<void>
  /** The app's clock (buildApp's `now`: keys, failed authentications, in-process rate limits), second instances' too: one the test moves. */
  now?: () => number
  /** The erasure job's settings (buildApp's `erasure`): a grace of 0, small batches, or no job on this instance. */
  erasure?: AppOptions['erasure']
}

/** The configuration tests run with: the defaults, plus what a test overrides. */
export function testConfig (env: Record<string, string> = {}): Config {
  return loadConfig({ LOG_LEVEL: 'info', SEALING_KEYS: TEST_SEALING_KEYS, ...env })
}

/**
 * A fresh database with the real migrations (PGlite from a snapshot, or a new PostgreSQL
 * database when DATABASE_URL is set), the app built on it, and teardown of both.
 */
export async function build (t: TestContext, options: BuildOptions = {}): Promise<Built> {
  const fresh = await freshDatabase()
  const config = testConfig(options.env)
  let logText = ''
  const logStream = new Writable({
    write (chunk: Buffer, _encoding, done) {
      logText += chunk.toString()
      done()
    }
  })
  const app = await buildApp({ config, database: fresh.database, logStream, now: options.now, erasure: options.erasure })
  // Closed before this app and its database: second instances and the like.
  const closers: (() => Promise<void>)[] = []
  t.teardown(async () => {
    for (const close of closers.reverse()) await close()
    await app.close()
    await fresh.drop()
  })
  if (options.routes !== undefined) await app.register(options.routes)
  await app.ready()

  const db = fresh.database.db
  const users = createUsersRepository(db)
  const keys = createKeysRepository(db)
  const callers = new Map<string, Caller>()

  function callerFor (address: string, key: { keyId: string, secret: string }): Caller {
    const authorization = basic(key.keyId, key.secret)
    const send = (method: 'GET' | 'POST' | 'PUT' | 'PATCH' | 'DELETE', url: string, body: Body | FormData | undefined, options: RequestOptions = {}) => {
      const encoded = body === undefined ? undefined : encodeBody(body, options.format ?? 'json')
      return app.inject({
        method,
        url,
        headers: { authorization, ...encoded?.headers, ...options.headers },
        ...(encoded !== undefined ? { payload: encoded.payload } : {})
      })
    }
    return {
      address,
      ...key,
      authorization,
      get: (url, options) => send('GET', url, undefined, options),
      delete: (url, options) => send('DELETE', url, undefined, options),
      post: (url, body, options) => send('POST', url, body ?? {}, options),
      patch: (url, body, options) => send('PATCH', url, body ?? {}, options),
      put: (url, options) => send('PUT', url, undefined, options)
    }
  }

  const built: Built = {
    url: fresh.url,
    async secondInstance (extraEnv = {}, erasure = options.erasure) {
      const database = fresh.url !== undefined ? await connectPostgres(fresh.url, 5) : fresh.database
      const other = await buildApp({ config: testConfig({ ...options.env, ...extraEnv }), database, logStream, now: options.now, erasure })
      closers.push(async () => {
        await other.close()
        if (database !== fresh.database) await database.close()
      })
      await other.ready()
      return other
    },
    app,
    database: fresh.database,
    db,
    config,
    logs: () => logText,
    async createUser (address, displayName) {
      if (await users.find(address) === undefined) await users.create({ address, displayName })
    },
    async createKey (address, dailyQuota = null) {
      return keys.create(address, dailyQuota)
    },
    callerFor,
    async as (address, options = {}) {
      const cached = callers.get(address)
      if (cached !== undefined && options.dailyQuota === undefined) return cached
      await built.createUser(address)
      const caller = callerFor(address, await keys.create(address, options.dailyQuota ?? null))
      if (options.dailyQuota === undefined) callers.set(address, caller)
      return caller
    }
  }
  return built
}
