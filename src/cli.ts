import { parseArgs } from 'node:util'
import { loadConfig, type Config } from './config.js'
import { openDatabase, type Database } from './db/client.js'
import { migrateDatabase, pendingMigrations } from './db/migrate.js'
import { isAddress } from './ids.js'
import { createKeysRepository, type ApiKey } from './modules/keys/keys.repository.js'
import { toUser } from './modules/users/users.schemas.js'
import { createUsersRepository } from './modules/users/users.repository.js'

const USAGE = `Usage: parley <command> [options]

Commands:
  migrate                                   apply pending database migrations
  serve                                     start the service
  user create <address> [--name NAME]       create a user
  user list                                 list users
  key create <address> [--daily-quota N]    create an API key; prints its secret once
  key list [<address>]                      list keys (never secrets)
  key revoke <keyId>                        revoke a key (refused everywhere within 5 s)
  key quota <keyId> <N>                     set a key's daily message quota

Options:
  --json      print JSON instead of text
  --help      show this help

Reads the same environment as the server: DATABASE_URL, or the embedded database in DATA_DIR.`

/** A mistake in how the command was called: exit 2, like most Unix tools. */
class UsageError extends Error {}

/** Where a command reads its settings and writes its output: the process, or a test's buffers. */
export interface CliIo {
  env: NodeJS.ProcessEnv
  stdout(text: string): void
  stderr(text: string): void
}

const processIo: CliIo = {
  env: process.env,
  stdout: (text) => { process.stdout.write(text) },
  stderr: (text) => { process.stderr.write(text) }
}

interface Output { json: boolean, io: CliIo }

function print (out: Output, value: unknown, text: string): void {
  out.io.stdout(out.json ? `${JSON.stringify(value, null, 2)}\n` : `${text}\n`)
}

function table (rows: string[][]): string {
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => r[i]!.length)))
  return rows.map((r) => r.map((cell, i) => cell.padEnd(widths[i]!)).join('  ').trimEnd()).join('\n')
}

function parseCount (value: string, what: string): number {
  if (!/^[0-9]{1,10}$/.test(value) || Number(value) > 1_000_000_000) {
    throw new UsageError(`${what} must be a whole number from 0 to 1000000000, got ${JSON.stringify(value)}`)
  }
  return Number(value)
}

function parseAddress (value: string | undefined): string {
  if (value === undefined) throw new UsageError('an address is required')
  const address = value.toLowerCase()
  if (!isAddress(address)) {
    throw new UsageError(`address ${JSON.stringify(value)} must be 1-64 characters of a-z 0-9 . @ + -, starting with a letter or digit`)
  }
  return address
}

/**
 * Opens the database for a command. The embedded database is brought up to date on the spot;
 * a shared PostgreSQL is migrated only by `parley migrate`, so other commands refuse to run
 * against an old schema rather than fail half-way.
 */
async function withDatabase<T> (config: Config, command: string, fn: (database: Database) => Promise<T>): Promise<T> {
  const database = await openDatabase({ databaseUrl: config.databaseUrl, dataDir: config.dataDir, command, poolSize: 2 })
  try {
    if (database.driver === 'pglite') {
      await migrateDatabase(database)
    } else {
      const pending = await pendingMigrations(database)
      if (pending.length > 0) {
        throw new Error(`the database schema is behind (${pending.length} migration(s) pending); run \`parley migrate\` first`)
      }
    }
    return await fn(database)
  } finally {
    await database.close()
  }
}

function keyRow (key: ApiKey): string[] {
  return [
    key.id,
    key.address,
    key.dailyQuota === null ? 'default' : String(key.dailyQuota),
    key.createdAt.toISOString(),
    key.revokedAt === null ? 'active' : `revoked ${key.revokedAt.toISOString()}`
  ]
}

function keyJson (key: ApiKey) {
  return {
    keyId: key.id,
    address: key.address,
    dailyQuota: key.dailyQuota,
    createdAt: key.createdAt.toISOString(),
    revokedAt: key.revokedAt?.toISOString() ?? null
  }
}

async function serve (config: Config): Promise<void> {
  // Loaded only here: the other commands need none of the HTTP stack.
  const { startService } = await import('./server.js')
  const service = await startService(config)
  let stopping = false
  const stop = (signal: string) => {
    if (stopping) return
    stopping = true
    service.app.log.info({ signal }, 'shutting down')
    // A stuck request must not keep the process alive past the orchestrator's patience.
    setTimeout(() => process.exit(1), 10_000).unref()
    service.close().then(() => process.exit(0), (err: unknown) => {
      service.app.log.error({ err }, 'shutdown failed')
      process.exit(1)
    })
  }
  process.once('SIGTERM', () => stop('SIGTERM'))
  process.once('SIGINT', () => stop('SIGINT'))
}

export async function run (argv: string[], io: CliIo = processIo): Promise<void> {
  const { values, positionals } = parseArgs({
    args: argv,
    allowPositionals: true,
    options: {
      json: { type: 'boolean', default: false },
      help: { type: 'boolean', short: 'h', default: false },
      name: { type: 'string' },
      'daily-quota': { type: 'string' }
    }
  })
  const out: Output = { json: values.json, io }
  const [command, sub, ...rest] = positionals
  if (values.help || command === undefined || command === 'help') {
    io.stdout(`${USAGE}\n`)
    return
  }

  const config = loadConfig(io.env)
  switch (`${command} ${sub ?? ''}`.trim()) {
    case 'serve':
      return serve(config)

    case 'migrate': {
      const database = await openDatabase({ databaseUrl: config.databaseUrl, dataDir: config.dataDir, command: 'migrate', poolSize: 2 })
      try {
        const applied = await migrateDatabase(database)
        print(out, { applied }, applied.length === 0
          ? 'Nothing to apply: the database schema is up to date.'
          : `Applied ${applied.length} migration(s):\n${applied.map((tag) => `  ${tag}`).join('\n')}`)
      } finally {
        await database.close()
      }
      return
    }

    case 'user create': {
      const address = parseAddress(rest[0])
      const user = await withDatabase(config, 'user create', async ({ db }) =>
        toUser(await createUsersRepository(db).create({ address, displayName: values.name })))
      print(out, user, `Created user ${user.address}.`)
      return
    }

    case 'user list': {
      const users = await withDatabase(config, 'user list', async ({ db }) => (await createUsersRepository(db).list()).map(toUser))
      print(out, users, table([
        ['ADDRESS', 'NAME', 'BOT', 'CREATED'],
        ...users.map((u) => [u.address, u.displayName ?? '', u.bot ? 'yes' : 'no', u.createdAt])
      ]))
      return
    }

    case 'key create': {
      const address = parseAddress(rest[0])
      const quota = values['daily-quota'] === undefined ? null : parseCount(values['daily-quota'], '--daily-quota')
      const key = await withDatabase(config, 'key create', async ({ db }) => {
        if (await createUsersRepository(db).find(address) === undefined) {
          throw new Error(`user ${address} does not exist; create it first with \`parley user create ${address}\``)
        }
        return createKeysRepository(db).create(address, quota)
      })
      print(out, key, [
        `Created a key for ${address}. The secret is shown only this once:`,
        `  key id:  ${key.keyId}`,
        `  secret:  ${key.secret}`
      ].join('\n'))
      return
    }

    case 'key list': {
      const address = rest[0] === undefined ? undefined : parseAddress(rest[0])
      const keys = await withDatabase(config, 'key list', async ({ db }) => createKeysRepository(db).list(address))
      print(out, keys.map(keyJson), keys.length === 0
        ? 'No keys.'
        : table([['KEY ID', 'ADDRESS', 'DAILY QUOTA', 'CREATED', 'STATUS'], ...keys.map(keyRow)]))
      return
    }

    case 'key revoke': {
      const keyId = rest[0]
      if (keyId === undefined) throw new UsageError('a key id is required')
      const key = await withDatabase(config, 'key revoke', async ({ db }) => createKeysRepository(db).revoke(keyId))
      print(out, keyJson(key), `Revoked key ${key.id}; every instance refuses it within 5 seconds.`)
      return
    }

    case 'key quota': {
      const [keyId, amount] = rest
      if (keyId === undefined || amount === undefined) throw new UsageError('usage: parley key quota <keyId> <N>')
      const quota = parseCount(amount, 'N')
      const key = await withDatabase(config, 'key quota', async ({ db }) => createKeysRepository(db).setDailyQuota(keyId, quota))
      print(out, keyJson(key), `Key ${key.id} may now send ${quota} messages per UTC day.`)
      return
    }

    default:
      throw new UsageError(`unknown command "${positionals.join(' ')}"; see \`parley --help\``)
  }
}

/** Runs a command; every failure ends as one line on stderr. Resolves with the exit code. */
export async function main (argv: string[], io: CliIo = processIo): Promise<number> {
  try {
    await run(argv, io)
    return 0
  } catch (err) {
    const reason = err instanceof Error ? err.message : String(err)
    io.stderr(`parley: ${reason.split('\n')[0]}\n`)
    return err instanceof UsageError || (err as { code?: string }).code?.startsWith('ERR_PARSE_ARGS') === true ? 2 : 1
  }
}
