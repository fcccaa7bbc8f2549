import { once } from 'node:events'
import { createWriteStream, readFileSync } from 'node:fs'
import { rm } from 'node:fs/promises'
import { pipeline } from 'node:stream/promises'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'
import { ZipFile } from 'yazl'
import { loadConfig, type Config } from './config.js'
import { openDatabase, type Database, type DatabaseOptions } from './db/client.js'
import { migrateDatabase, pendingMigrations } from './db/migrate.js'
import { isAddress, normalizeAddress } from './ids.js'
import { createAuditRepository, toAuditEntry } from './modules/audit/audit.repository.js'
import { AUDIT_ACTIONS, isAuditAction, type AuditEntry } from './modules/audit/audit.schemas.js'
import { audited, CLI_SOURCE, userChangeActions } from './modules/audit/audit.service.js'
import { cutArchive, runExport } from './modules/export/export.service.js'
import { createKeysRepository, type ApiKey } from './modules/keys/keys.repository.js'
import { isKeyId } from './modules/keys/keys.schemas.js'
import { isScope, SCOPES } from './scopes.js'
import { displayNameProblem } from './modules/users/display-name.js'
import { createUsersRepository, erasedConflict, toAdminUser, toUser } from './modules/users/users.repository.js'
import { verifySealingKeys } from './sealing/key-check.js'
import { resolveSealingKeys, type ResolvedKeys } from './sealing/key-file.js'
import { installKeyring, Keyring } from './sealing/keyring.js'
import { progressBar } from './sealing/progress-bar.js'
import { runSealingPass, type SealMode, type SealPassResult } from './sealing/reseal.js'
import { rotateText, statusText } from './sealing/seal-report.js'
import { sealStatus } from './sealing/seal-status.js'

/** Each command: how it is called, what it does, and the options it takes besides --json/--help. */
const COMMANDS: Record<string, { usage: string, does: string, options: string[] }> = {
  migrate: { usage: 'migrate', does: 'apply pending database migrations, then seal what was written before sealing', options: [] },
  serve: { usage: 'serve', does: 'start the service', options: [] },
  'user create': { usage: 'user create <address> [--name NAME]', does: 'create a user', options: ['name'] },
  'user list': { usage: 'user list', does: 'list users', options: [] },
  'user deactivate': { usage: 'user deactivate <address>', does: 'stop a user\'s keys (401) and deliveries to it', options: [] },
  'user reactivate': { usage: 'user reactivate <address>', does: 'undo user deactivate', options: [] },
  'user export': {
    usage: 'user export <address> --output FILE',
    does: 'write everything of a user\'s (messages, files, groups, roster, metadata, profile) into a zip, as GET /v2/admin/users/{user}/export',
    options: ['output']
  },
  'user erase': {
    usage: 'user erase <address>',
    does: 'erase a user: deactivated now, its messages, files and the rest removed by the running service (API.md §14)',
    options: []
  },
  'key create': {
    usage: 'key create <address> [--daily-quota N] [--scope S]…',
    does: 'create an API key (scopes read, send, admin; default read and send); prints its secret once',
    options: ['daily-quota', 'scope']
  },
  'key list': { usage: 'key list [<address>]', does: 'list keys (never secrets)', options: [] },
  'key revoke': { usage: 'key revoke <keyId>', does: 'revoke a key (refused everywhere within 5 s)', options: [] },
  'key quota': { usage: 'key quota <keyId> <N>', does: 'set a key\'s daily message quota', options: [] },
  'seal status': {
    usage: 'seal status',
    does: 'count, per table, the records still plain and those under each sealing key id (flags ids SEALING_KEYS lacks)',
    options: []
  },
  'seal rotate': {
    usage: 'seal rotate',
    does: 're-seal everything under the first key of SEALING_KEYS, online and resumably; then say which keys can be dropped',
    options: []
  },
  audit: {
    usage: 'audit [--limit N] [--actor X] [--action A] [--target T]',
    does: 'show the audit log, newest first (actor: a key id, an address, or cli)',
    options: ['limit', 'actor', 'action', 'target']
  }
}

const USAGE = `Usage: parley <command> [options]

Commands:
${Object.values(COMMANDS).map((c) => `  ${c.usage.padEnd(42)}${c.does}`).join('\n')}

Options:
  --json      print JSON instead of text
  --help      show this help (or a command's: parley <command> --help)
  --version   print the version

Reads the same environment as the server: DATABASE_URL, or the embedded database in DATA_DIR;
SEALING_KEYS (or DATA_DIR/sealing.key) for the commands that read content.`

/** The package's version: package.json sits one level above both src/ and dist/. */
function version (): string {
  const file = fileURLToPath(new URL('../package.json', import.meta.url))
  return (JSON.parse(readFileSync(file, 'utf8')) as { version: string }).version
}

/** A mistake in how the command was called: exit 2, like most Unix tools. */
class UsageError extends Error {}

/** Where a command reads its settings and writes its output: the process, or a test's buffers. */
export interface CliIo {
  env: NodeJS.ProcessEnv
  stdout(text: string): void
  stderr(text: string): void
  /**
   * How a command opens the database: openDatabase, or (tests of the commands themselves) one
   * already open, so that each command does not start the embedded database anew.
   */
  openDatabase?: (options: DatabaseOptions) => Promise<Database>
  /** Whether stderr is a terminal: a progress bar redrawn in place, or plain lines. */
  stderrIsTTY?: boolean
}

const processIo: CliIo = {
  env: process.env,
  stdout: (text) => { process.stdout.write(text) },
  stderr: (text) => { process.stderr.write(text) },
  stderrIsTTY: process.stderr.isTTY
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
  const address = normalizeAddress(value)
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
async function withDatabase<T> (config: Config, io: CliIo, command: string, fn: (database: Database) => Promise<T>): Promise<T> {
  const database = await (io.openDatabase ?? openDatabase)({ databaseUrl: config.databaseUrl, directUrl: config.databaseDirectUrl, pooler: config.databasePooler, dataDir: config.dataDir, command, poolSize: 2 })
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

/**
 * The sealing keys of a command that reads or writes content (SEALING_KEYS, or the embedded
 * database's key file, made on its first use), installed for the process; the line about a
 * key file made just now goes to stderr.
 */
function installSealingKeys (config: Config, io: CliIo): ResolvedKeys {
  const resolved = resolveSealingKeys(config)
  installKeyring(new Keyring(resolved.keys))
  if (resolved.generated !== undefined) io.stderr(`${resolved.generated}\n`)
  return resolved
}

/** A sealing pass to its end, with a progress bar on stderr. */
async function sealWithProgress (database: Database, mode: SealMode, io: CliIo): Promise<SealPassResult> {
  const bar = progressBar((text) => io.stderr(text), io.stderrIsTTY === true)
  try {
    return await runSealingPass(database.db, { mode, onProgress: ({ table, done, total }) => bar.update(table, done, total) })
  } finally {
    bar.end()
  }
}

function keyRow (key: ApiKey): string[] {
  return [
    key.id,
    key.address,
    key.dailyQuota === null ? 'default' : String(key.dailyQuota),
    key.scopes.join(','),
    key.createdAt.toISOString(),
    key.revokedAt === null ? 'active' : `revoked ${key.revokedAt.toISOString()}`
  ]
}

function keyJson (key: ApiKey) {
  return {
    keyId: key.id,
    address: key.address,
    dailyQuota: key.dailyQuota,
    scopes: key.scopes,
    createdAt: key.createdAt.toISOString(),
    revokedAt: key.revokedAt?.toISOString() ?? null,
    expiresAt: key.expiresAt?.toISOString() ?? null,
    lastUsedAt: key.lastUsedAt?.toISOString() ?? null
  }
}

/** --actor: a key id as it is, an address lower-case (as stored), or cli. */
function parseActor (value: string): string {
  if (isKeyId(value)) return value
  return parseAddress(value)
}

function auditRow (entry: AuditEntry): string[] {
  const actor = entry.actor === 'cli' ? 'cli' : `${entry.actor.address} (${entry.actor.key})`
  return [entry.id, entry.at, actor, entry.action, entry.target, entry.requestId ?? '', entry.ip ?? '']
}

/** Writes `address`'s export to `path` (a new file: an existing one is refused), audited as the CLI's; its size in bytes. */
async function exportToFile (database: Database, address: string, path: string): Promise<number> {
  const file = createWriteStream(path, { flags: 'wx', mode: 0o600 })
  await once(file, 'open')
  const zip = new ZipFile()
  const written = pipeline(zip.outputStream, file)
  // A write that fails (a full disk) stops the export, rather than leave it waiting on a file
  // that takes nothing more.
  let failed: unknown
  written.catch((err: unknown) => { failed = err })
  try {
    await runExport(database, address, zip, CLI_SOURCE, (run) => {
      written.catch((err: unknown) => { run.abort(`${path} could not be written: ${(err as Error).message}`) })
    })
    await written
  } catch (err) {
    cutArchive(zip)
    await written.catch(() => {})
    await rm(path, { force: true })
    throw failed ?? err
  }
  return file.bytesWritten
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
      version: { type: 'boolean', short: 'v', default: false },
      name: { type: 'string' },
      output: { type: 'string', short: 'o' },
      'daily-quota': { type: 'string' },
      scope: { type: 'string', multiple: true },
      limit: { type: 'string' },
      actor: { type: 'string' },
      action: { type: 'string' },
      target: { type: 'string' }
    }
  })
  const out: Output = { json: values.json, io }
  const [command, sub, ...rest] = positionals
  if (values.version) {
    print(out, { version: version() }, `parley ${version()}`)
    return
  }
  if (command === undefined || command === 'help') {
    io.stdout(`${USAGE}\n`)
    return
  }
  const name = command === 'serve' || command === 'migrate' || command === 'audit' ? command : `${command} ${sub ?? ''}`.trim()
  const spec = COMMANDS[name]
  if (spec === undefined) {
    if (values.help) {
      io.stdout(`${USAGE}\n`)
      return
    }
    throw new UsageError(`unknown command "${positionals.join(' ')}"; see \`parley --help\``)
  }
  if (values.help) {
    io.stdout(`Usage: parley ${spec.usage}\n\n${spec.does[0]!.toUpperCase()}${spec.does.slice(1)}.\n`)
    return
  }
  // An option another command takes is a mistake here, not something to ignore silently.
  const stray = (['name', 'output', 'daily-quota', 'scope', 'limit', 'actor', 'action', 'target'] as const).find((option) => values[option] !== undefined && !spec.options.includes(option))
  if (stray !== undefined) throw new UsageError(`parley ${name} takes no --${stray}; usage: parley ${spec.usage}`)
  if ((name === 'serve' || name === 'migrate' || name === 'audit') && sub !== undefined) {
    throw new UsageError(`parley ${name} takes no arguments; usage: parley ${spec.usage}`)
  }

  const config = loadConfig(io.env)
  switch (name) {
    case 'serve':
      return serve(config)

    case 'migrate': {
      const sealing = installSealingKeys(config, io)
      const database = await (io.openDatabase ?? openDatabase)({ databaseUrl: config.databaseUrl, directUrl: config.databaseDirectUrl, pooler: config.databasePooler, dataDir: config.dataDir, command: 'migrate', poolSize: 2 })
      try {
        const applied = await migrateDatabase(database)
        await verifySealingKeys(database.db, sealing)
        // A database from before sealing is sealed here, to the end, rather than by the next start in the background.
        const { sealed } = await sealWithProgress(database, 'plain', io)
        const migrated = applied.length === 0
          ? 'Nothing to apply: the database schema is up to date.'
          : `Applied ${applied.length} migration(s):\n${applied.map((tag) => `  ${tag}`).join('\n')}`
        print(out, { applied, sealed }, sealed === 0 ? migrated : `${migrated}\nSealed ${sealed} record(s) written before sealing.`)
      } finally {
        await database.close()
      }
      return
    }

    case 'user create': {
      const address = parseAddress(rest[0])
      // Refused before the database is opened, naming the option, as a bad address is.
      const nameProblem = values.name === undefined ? undefined : displayNameProblem(values.name)
      if (nameProblem !== undefined) throw new UsageError(`--name ${nameProblem}`)
      const user = await withDatabase(config, io, 'user create', async ({ db }) => toUser(await audited(db, CLI_SOURCE, async (tx, record) => {
        const row = await createUsersRepository(tx).create({ address, displayName: values.name })
        await record('user.create', row.address)
        return row
      })))
      print(out, user, `Created user ${user.address}.`)
      return
    }

    case 'user list': {
      const users = await withDatabase(config, io, 'user list', async ({ db }) => (await createUsersRepository(db).list()).map(toUser))
      print(out, users, table([
        ['ADDRESS', 'NAME', 'BOT', 'CREATED'],
        ...users.map((u) => [u.address, u.displayName ?? '', u.bot ? 'yes' : 'no', u.createdAt])
      ]))
      return
    }

    case 'user deactivate':
    case 'user reactivate': {
      const address = parseAddress(rest[0])
      const deactivated = sub === 'deactivate'
      const row = await withDatabase(config, io, name, async ({ db }) => audited(db, CLI_SOURCE, async (tx, record) => {
        const row = await createUsersRepository(tx).update(address, { deactivated })
        if (row === undefined) throw new Error(`user ${address} not found`)
        for (const action of userChangeActions({ deactivated })) await record(action, row.address)
        return row
      }))
      print(out, toAdminUser(row), deactivated
        ? `Deactivated ${address}: its keys are refused everywhere within 5 seconds and it receives nothing.`
        : `Reactivated ${address}.`)
      return
    }

    case 'user export': {
      const address = parseAddress(rest[0])
      const output = values.output
      if (output === undefined) throw new UsageError(`parley user export needs --output FILE; usage: parley ${spec.usage}`)
      const sealing = installSealingKeys(config, io)
      const bytes = await withDatabase(config, io, name, async (database) => {
        await verifySealingKeys(database.db, sealing)
        if (await createUsersRepository(database.db).find(address) === undefined) throw new Error(`user ${address} not found`)
        return exportToFile(database, address, output)
      })
      print(out, { address, output, bytes }, `Exported ${address} to ${output} (${(bytes / 2 ** 20).toFixed(1)} MiB).`)
      return
    }

    case 'user erase': {
      const address = parseAddress(rest[0])
      const row = await withDatabase(config, io, name, async ({ db }) => audited(db, CLI_SOURCE, async (tx, record) => {
        const row = await createUsersRepository(tx).requestErasure(address)
        if (row === undefined) throw new Error(`user ${address} not found`)
        await record('user.erase', row.address)
        return row
      }))
      const user = toAdminUser(row)
      print(out, user, user.erasure === 'done'
        ? `${address} is erased already; its address stays reserved.`
        : `Erasure of ${address} recorded: its keys are refused everywhere within 5 seconds, and the service erases the rest ` +
          `in the background (on its next start if none runs now); GET /v2/admin/users/${address} shows erasure pending, then done.`)
      return
    }

    case 'key create': {
      const address = parseAddress(rest[0])
      const quota = values['daily-quota'] === undefined ? null : parseCount(values['daily-quota'], '--daily-quota')
      const scopes = values.scope?.map((scope) => {
        if (!isScope(scope)) throw new UsageError(`--scope must be one of ${SCOPES.join(', ')}, got ${JSON.stringify(scope)}`)
        return scope
      })
      const created = await withDatabase(config, io, 'key create', async ({ db }) => {
        return audited(db, CLI_SOURCE, async (tx, record) => {
          // The user's row locked in the key's transaction, as the admin API does (no key slips past an erasure).
          const user = await createUsersRepository(tx).find(address, 'share')
          if (user === undefined) {
            throw new Error(`user ${address} does not exist; create it first with \`parley user create ${address}\``)
          }
          if (user.erasureRequestedAt !== null) throw erasedConflict(address, 'it gets no keys')
          const created = await createKeysRepository(tx).create(address, quota, scopes === undefined ? {} : { scopes })
          await record('key.create', created.keyId)
          return created
        })
      })
      // --json keeps API.md §7's shape: {"keyId", "secret"}.
      const key = { keyId: created.keyId, secret: created.secret }
      print(out, key, [
        `Created a key for ${address} (scopes: ${created.key.scopes.join(', ')}). The secret is shown only this once:`,
        `  key id:  ${key.keyId}`,
        `  secret:  ${key.secret}`
      ].join('\n'))
      return
    }

    case 'key list': {
      const address = rest[0] === undefined ? undefined : parseAddress(rest[0])
      const keys = await withDatabase(config, io, 'key list', async ({ db }) => createKeysRepository(db).list(address))
      print(out, keys.map(keyJson), keys.length === 0
        ? 'No keys.'
        : table([['KEY ID', 'ADDRESS', 'DAILY QUOTA', 'SCOPES', 'CREATED', 'STATUS'], ...keys.map(keyRow)]))
      return
    }

    case 'key revoke': {
      const keyId = rest[0]
      if (keyId === undefined) throw new UsageError('a key id is required')
      const key = await withDatabase(config, io, 'key revoke', async ({ db }) => audited(db, CLI_SOURCE, async (tx, record) => {
        const key = await createKeysRepository(tx).revoke(keyId)
        await record('key.revoke', key.id)
        return key
      }))
      print(out, keyJson(key), `Revoked key ${key.id}; every instance refuses it within 5 seconds.`)
      return
    }

    case 'key quota': {
      const [keyId, amount] = rest
      if (keyId === undefined || amount === undefined) throw new UsageError('usage: parley key quota <keyId> <N>')
      const quota = parseCount(amount, 'N')
      const key = await withDatabase(config, io, 'key quota', async ({ db }) => audited(db, CLI_SOURCE, async (tx, record) => {
        const key = await createKeysRepository(tx).setDailyQuota(keyId, quota)
        await record('key.update', key.id)
        return key
      }))
      print(out, keyJson(key), `Key ${key.id} may now send ${quota} messages per UTC day.`)
      return
    }

    case 'seal status': {
      const sealing = installSealingKeys(config, io)
      const ids = sealing.keys.map((k) => k.id)
      const status = await withDatabase(config, io, name, async ({ db }) => {
        await verifySealingKeys(db, sealing)
        return sealStatus(db)
      })
      print(out, { active: ids[0], configured: ids, ...status }, statusText(status, ids, ids[0]!))
      return
    }

    case 'seal rotate': {
      const sealing = installSealingKeys(config, io)
      const ids = sealing.keys.map((k) => k.id)
      const { result, status } = await withDatabase(config, io, name, async (database) => {
        await verifySealingKeys(database.db, sealing)
        const result = await sealWithProgress(database, 'rotate', io)
        return { result, status: await sealStatus(database.db) }
      })
      print(out, { active: ids[0], sealed: result.sealed, resealed: result.tables, broken: result.broken, skipped: result.skipped, status },
        rotateText(result, status, ids, ids[0]!))
      return
    }

    case 'audit': {
      const limit = values.limit === undefined ? 50 : parseCount(values.limit, '--limit')
      if (limit < 1 || limit > 200) throw new UsageError(`--limit must be a whole number from 1 to 200, got ${JSON.stringify(values.limit)}`)
      const action = values.action
      if (action !== undefined && !isAuditAction(action)) {
        throw new UsageError(`--action must be one of ${AUDIT_ACTIONS.join(', ')}, got ${JSON.stringify(action)}`)
      }
      const actor = values.actor === undefined ? undefined : parseActor(values.actor)
      const entries = await withDatabase(config, io, 'audit', async ({ db }) =>
        (await createAuditRepository(db).page({ actor, action, target: values.target }, undefined, limit)).map(toAuditEntry))
      print(out, entries, entries.length === 0
        ? 'No entries.'
        : table([['ID', 'AT', 'ACTOR', 'ACTION', 'TARGET', 'REQUEST', 'IP'], ...entries.map(auditRow)]))
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
