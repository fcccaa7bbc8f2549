import { spawn, type ChildProcess } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { createServer } from 'node:net'
import { join } from 'node:path'
import pg from 'pg'
import { connectPostgres } from '../src/db/client.js'
import { migrateDatabase } from '../src/db/migrate.js'
import { createGroupsRepository } from '../src/modules/groups/groups.repository.js'
import { createKeysRepository } from '../src/modules/keys/keys.repository.js'
import { createUsersRepository } from '../src/modules/users/users.repository.js'
import { serveNodeArgs } from '../test/support/processes.js'

export const ROOT = join(import.meta.dirname, '..')

export interface Key { address: string, keyId: string, secret: string, authorization: string }

export interface Fixtures {
  /** Sender i sends to receiver i: one pair per connection, so no two connections share a row lock. */
  senders: Key[]
  receivers: Key[]
  /** Groups of 20 members (distinct users), owned by their first member. */
  groups: { id: string, sender: Key }[]
  /** One user per waiting poller (scenario 4). */
  pollers: Key[]
  /** Keys for the idle long-polls of the memory scenario, MAX_LONG_POLLS_PER_KEY each. */
  idlers: Key[]
}

/** A database made for this run and dropped after it. */
export async function freshDatabase (adminUrl: string): Promise<{ url: string, drop: () => Promise<void> }> {
  const name = `parley_bench_${Date.now()}`
  const admin = async (sql: string) => {
    const client = new pg.Client({ connectionString: adminUrl })
    await client.connect()
    try { await client.query(sql) } finally { await client.end() }
  }
  await admin(`CREATE DATABASE "${name}"`)
  const url = new URL(adminUrl)
  url.pathname = `/${name}`
  return { url: url.toString(), drop: () => admin(`DROP DATABASE IF EXISTS "${name}" WITH (FORCE)`) }
}

/** Migrates the database and creates the users, keys and groups the scenarios use. */
export async function createFixtures (url: string, counts: { pairs: number, groups: number, pollers: number, idlers: number }): Promise<Fixtures> {
  const database = await connectPostgres(url, 10)
  try {
    await migrateDatabase(database)
    const users = createUsersRepository(database.db)
    const keys = createKeysRepository(database.db)
    const make = async (address: string): Promise<Key> => {
      await users.create({ address, displayName: null })
      const key = await keys.create(address, 1_000_000_000)
      return { address, ...key, authorization: `Basic ${Buffer.from(`${key.keyId}:${key.secret}`).toString('base64')}` }
    }
    const batch = async (prefix: string, n: number): Promise<Key[]> => {
      const made: Key[] = []
      for (let i = 0; i < n; i += 25) {
        made.push(...await Promise.all(Array.from({ length: Math.min(25, n - i) }, (_, j) => make(`${prefix}${i + j}`))))
      }
      return made
    }
    const senders = await batch('sender', counts.pairs)
    const receivers = await batch('receiver', counts.pairs)
    const members = await batch('member', counts.groups * 20)
    const groups = []
    for (let g = 0; g < counts.groups; g++) {
      const own = members.slice(g * 20, g * 20 + 20)
      const group = await createGroupsRepository(database.db).create(`bench ${g}`, own[0]!.address, own.map((m) => m.address))
      groups.push({ id: group.id, sender: own[0]! })
    }
    return { senders, receivers, groups, pollers: await batch('poller', counts.pollers), idlers: await batch('idler', counts.idlers) }
  } finally {
    await database.close()
  }
}

async function freePort (): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer()
    server.once('error', reject)
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as { port: number }
      server.close(() => resolve(port))
    })
  })
}

export interface Service {
  url: string
  child: ChildProcess
  /** Resident memory of the server process, in bytes. */
  rss(): number
  stop(): Promise<void>
}

/** The sealing key of the benches' servers: a fixed one, as their databases are thrown away. */
export const BENCH_SEALING_KEYS = `bench:${'b3'.repeat(32)}`

/** Starts `parley serve` from this checkout on the bench database and waits until it is ready (`nodeArgs`: --cpu-prof, say). */
export async function startService (databaseUrl: string, env: Record<string, string>, nodeArgs: string[] = []): Promise<Service> {
  const port = await freePort()
  const child = spawn(process.execPath, [...serveNodeArgs(), ...nodeArgs, join(ROOT, 'bin', 'parley.js'), 'serve'], {
    // A bench key unless the caller's environment gives one: the service refuses PostgreSQL without (API.md §11).
    env: { SEALING_KEYS: BENCH_SEALING_KEYS, ...process.env, DATABASE_URL: databaseUrl, HOST: '127.0.0.1', PORT: String(port), ...env },
    stdio: ['ignore', 'ignore', 'inherit']
  })
  const url = `http://127.0.0.1:${port}`
  const deadline = Date.now() + 60_000
  for (;;) {
    if (child.exitCode !== null) throw new Error(`the service exited with ${child.exitCode}`)
    const ready = await fetch(`${url}/readyz`).then((r) => r.ok, () => false)
    if (ready) break
    if (Date.now() > deadline) throw new Error('the service did not become ready in 60 s')
    await new Promise((resolve) => setTimeout(resolve, 200))
  }
  return {
    url,
    child,
    rss: () => {
      const status = readFileSync(`/proc/${child.pid}/status`, 'utf8')
      return Number(/VmRSS:\s+(\d+) kB/.exec(status)?.[1] ?? 0) * 1024
    },
    stop: async () => {
      if (child.exitCode !== null) return
      const exited = new Promise((resolve) => child.once('exit', resolve))
      child.kill('SIGTERM')
      await exited
    }
  }
}
