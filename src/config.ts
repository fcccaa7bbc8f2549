import { readFileSync } from 'node:fs'
import { Type, type Static, type TSchema } from 'typebox'
import { Value } from 'typebox/value'
import { ADDRESS_PATTERN } from './ids.js'
import { parseSealingKeys, type SealingKey } from './sealing/keyring.js'

const Int = (minimum: number, maximum: number, fallback: number, description: string) =>
  Type.Integer({ minimum, maximum, default: fallback, description })

/**
 * The environment the service reads, as a schema: each property's description says what the
 * variable accepts, and is the text an operator sees when the value is wrong.
 */
const ConfigSchema = Type.Object({
  HOST: Type.String({ minLength: 1, default: '127.0.0.1', description: 'a host name or IP address to listen on' }),
  PORT: Int(0, 65535, 3000, 'an integer from 0 to 65535'),
  DATABASE_URL: Type.Optional(Type.String({
    pattern: '^postgres(ql)?://',
    description: 'a PostgreSQL connection URL (postgres://user:password@host:5432/db)'
  })),
  DATABASE_POOL_SIZE: Int(1, 1000, 10, 'an integer from 1 to 1000'),
  // How often the LISTEN connection is checked with SELECT 1 (and how long it may take).
  LISTEN_HEARTBEAT_MS: Int(100, 3_600_000, 15_000, 'an integer number of milliseconds from 100 to 3600000'),
  // A session connection for LISTEN and migrations when DATABASE_URL is a transaction pooler.
  DATABASE_DIRECT_URL: Type.Optional(Type.String({
    pattern: '^postgres(ql)?://',
    description: 'a PostgreSQL connection URL that reaches the server directly, not through a transaction pooler (postgres://user:password@host:5432/db)'
  })),
  // Whether DATABASE_URL is a transaction pooler such as PgBouncer (no named statements through
  // it); auto: when DATABASE_DIRECT_URL is set and differs from DATABASE_URL.
  DATABASE_POOLER: Type.Union([Type.Literal('auto'), Type.Literal('transaction'), Type.Literal('none')], {
    default: 'auto',
    description: 'one of auto, transaction, none'
  }),
  DATA_DIR: Type.String({ minLength: 1, default: './data', description: 'a directory path for the embedded database' }),
  DATABASE_READ_URL: Type.Optional(Type.String({
    pattern: '^postgres(ql)?://',
    description: 'a PostgreSQL connection URL of a streaming replica of DATABASE_URL (postgres://user:password@replica:5432/db)'
  })),
  DATABASE_READ_MAX_WAIT_MS: Int(0, 10_000, 50, 'an integer number of milliseconds from 0 to 10000'),
  METRICS_PORT: Type.Optional(Type.Integer({ minimum: 0, maximum: 65535, description: 'an integer from 0 to 65535' })),
  REDIS_URL: Type.Optional(Type.String({ pattern: '^rediss?://', description: 'a Redis URL (redis://host:6379)' })),
  LOG_LEVEL: Type.Union(
    ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'].map((level) => Type.Literal(level)),
    { default: 'info', description: 'one of fatal, error, warn, info, debug, trace, silent' }
  ),
  TRUST_PROXY: Type.String({
    pattern: '^(true|false|[0-9]+|[0-9a-fA-F.:/]+(,[0-9a-fA-F.:/]+)*)$',
    default: 'false',
    description: 'true, false, a hop count, or a comma-separated list of proxy IP addresses or CIDR ranges'
  }),
  DAILY_MESSAGE_QUOTA: Int(0, 1_000_000_000, 100, 'an integer from 0 to 1000000000'),
  RATE_LIMIT_PER_SECOND: Int(1, 1_000_000, 20, 'an integer from 1 to 1000000'),
  MAX_BODY_CHARS: Int(1, 1_000_000, 10_000, 'an integer from 1 to 1000000'),
  MESSAGE_EDIT_WINDOW_SECONDS: Int(0, 315_360_000, 86_400, 'an integer number of seconds from 0 to 315360000'),
  MAX_ATTACHMENTS: Int(0, 100, 10, 'an integer from 0 to 100'),
  MAX_ATTACHMENT_BYTES: Int(1, 1024 * 1024 * 1024, 25 * 1024 * 1024, 'an integer number of bytes from 1 to 1073741824'),
  MAX_LONG_POLLS_PER_KEY: Int(1, 10_000, 10, 'an integer from 1 to 10000'),
  EVENT_STREAM_HEARTBEAT_SECONDS: Int(1, 15, 15, 'an integer number of seconds from 1 to 15'),
  REQUEST_TIMEOUT_SECONDS: Int(1, 3600, 60, 'an integer number of seconds from 1 to 3600'),
  MAX_GROUP_MEMBERS: Int(1, 100_000, 1_000, 'an integer from 1 to 100000'),
  AUDIT_RETENTION_DAYS: Int(1, 36_500, 365, 'an integer number of days from 1 to 36500'),
  EXPORT_MAX_SECONDS: Int(1, 86_400, 3_600, 'an integer number of seconds from 1 to 86400'),
  // Unset: messages are kept until deleted.
  MESSAGE_RETENTION_DAYS: Type.Optional(Type.Integer({ minimum: 1, maximum: 36_500, description: 'an integer number of days from 1 to 36500' })),
  WEBHOOK_ALLOW_PRIVATE: Type.Union([Type.Literal('true'), Type.Literal('false')], {
    default: 'false',
    description: 'true or false: whether webhooks may target private, loopback and link-local addresses, and plain http://'
  }),
  WEBHOOK_SECRETS_KEY: Type.Optional(Type.String({
    pattern: '^[0-9a-fA-F]{64}$',
    description: '64 hexadecimal digits (32 random bytes, e.g. from `openssl rand -hex 32`)'
  })),
  // Content sealed at rest (API.md §11): the first key seals, the others still open.
  SEALING_KEYS: Type.Optional(Type.String({
    pattern: '^\\s*[A-Za-z0-9_-]{1,32}:[0-9a-fA-F]{64}\\s*(,\\s*[A-Za-z0-9_-]{1,32}:[0-9a-fA-F]{64}\\s*)*$',
    description: 'id:hex64[,id:hex64…]: key ids of 1-32 letters, digits, _ or -, each with 64 hexadecimal digits (32 random bytes, e.g. from `openssl rand -hex 32`); the first seals new data'
  })),
  TEST_BOT_ADDRESS: Type.String({
    pattern: ADDRESS_PATTERN,
    default: 'testbot',
    description: 'a user address: 1-64 characters of a-z 0-9 . @ + -, starting with a letter or digit'
  })
})

type Env = Static<typeof ConfigSchema>

/** Variables whose values may hold credentials: never echoed back in an error. */
const SECRET_VARIABLES = new Set(['DATABASE_URL', 'DATABASE_DIRECT_URL', 'DATABASE_READ_URL', 'REDIS_URL', 'WEBHOOK_SECRETS_KEY', 'SEALING_KEYS'])

type TrustProxy = boolean | number | string[]

export interface Config {
  host: string
  port: number
  /** Serve GET /metrics on this port (on HOST) instead of the API's; undefined: on the API's. */
  metricsPort: number | undefined
  databaseUrl: string | undefined
  /** PostgreSQL connections the server keeps (besides its one LISTEN connection). */
  databasePoolSize: number
  /** How often the LISTEN connection must answer SELECT 1 (and within how long) to be kept. */
  listenHeartbeatMs: number
  /** The session connection for LISTEN and migrations; undefined: databaseUrl's. */
  databaseDirectUrl: string | undefined
  /** 'transaction': databaseUrl is a transaction pooler (unnamed statements only). */
  databasePooler: 'transaction' | 'none'
  dataDir: string
  /** A streaming replica for reads that may be served from it (src/db/replica.ts); undefined: none. */
  databaseReadUrl: string | undefined
  /** How long a replica read waits for the replica to replay the primary's WAL before it goes to the primary. */
  databaseReadMaxWaitMs: number
  redisUrl: string | undefined
  logLevel: Env['LOG_LEVEL']
  trustProxy: TrustProxy
  dailyMessageQuota: number
  rateLimitPerSecond: number
  maxBodyChars: number
  /** Seconds after sending during which the sender may edit a message's body (PATCH /message/{id}); 0 never. */
  messageEditWindowSeconds: number
  maxAttachments: number
  maxAttachmentBytes: number
  maxLongPollsPerKey: number
  /** Seconds between comment lines on an idle GET /v2/events/stream (at most 15, API.md §9). */
  eventStreamHeartbeatSeconds: number
  /** Seconds a client has to send a whole request (its headers: at most 10 of them). */
  requestTimeoutSeconds: number
  /** Members a group may have, its owner included: bounds the fan-out of one send. */
  maxGroupMembers: number
  /** Days an audit log entry is kept; retention purges older ones. */
  auditRetentionDays: number
  /** How long one export may stream (it holds a snapshot on PostgreSQL): past it, it is cut. */
  exportMaxSeconds: number
  /** Days a message is kept before retention purges it (a group may keep its own for less); undefined: until deleted. */
  messageRetentionDays: number | undefined
  /** Webhooks may target private, loopback and link-local addresses, and http:// (development). */
  webhookAllowPrivate: boolean
  /** Seals webhook signing secrets at rest (AES-256-GCM); unset stores them as they are. */
  webhookSecretsKey: Buffer | undefined
  /** SEALING_KEYS: the first seals new content, the others open what they sealed; undefined: not set (src/sealing/key-file.ts decides). */
  sealingKeys: SealingKey[] | undefined
  testBotAddress: string
}

export class ConfigError extends Error {
  override name = 'ConfigError'
}

function parseTrustProxy (value: string): TrustProxy {
  if (value === 'true') return true
  if (value === 'false') return false
  if (/^[0-9]+$/.test(value)) return Number(value)
  return value.split(',')
}

/**
 * Secrets may come from files (Docker and Kubernetes secrets): `DATABASE_URL_FILE=/run/secrets/db`
 * stands for DATABASE_URL with the file's contents, less a trailing newline. Giving both, or a
 * file that cannot be read, is a configuration error.
 */
function withSecretFiles (env: NodeJS.ProcessEnv, problems: string[]): NodeJS.ProcessEnv {
  const resolved = { ...env }
  for (const name of SECRET_VARIABLES) {
    const file = env[`${name}_FILE`]
    if (file === undefined || file === '') continue
    if (env[name] !== undefined && env[name] !== '') {
      problems.push(`${name} and ${name}_FILE are both set; give one`)
      continue
    }
    try {
      resolved[name] = readFileSync(file, 'utf8').replace(/\r?\n$/, '')
    } catch (err) {
      problems.push(`${name}_FILE must name a readable file (${(err as NodeJS.ErrnoException).code ?? 'unreadable'}: ${JSON.stringify(file)})`)
    }
  }
  return resolved
}

/**
 * Reads the configuration from an environment. Empty strings count as unset. A bad value
 * throws a ConfigError whose message is one line naming every variable at fault and what
 * each accepts.
 */
export function loadConfig (given: NodeJS.ProcessEnv = process.env): Config {
  const raw: Record<string, unknown> = {}
  const problems: string[] = []
  const env = withSecretFiles(given, problems)
  for (const [name, schema] of Object.entries(ConfigSchema.properties) as [string, TSchema & { description?: string }][]) {
    const given = env[name]
    if (given === undefined || given === '') continue
    // Integers are written as plain decimal digits: "1.5", "1e3", "0x10" and "true" are mistakes.
    const isInteger = (schema as { type?: unknown }).type === 'integer'
    const value = isInteger && /^-?[0-9]+$/.test(given) ? Number(given) : given
    if (Value.Check(schema, value)) {
      raw[name] = value
    } else {
      const shown = SECRET_VARIABLES.has(name) ? '' : ` (got ${JSON.stringify(given)})`
      problems.push(`${name} must be ${schema.description ?? 'valid'}${shown}`)
    }
  }
  if (raw.DATABASE_URL === undefined) {
    // Without DATABASE_URL the database is embedded: no pooler, and nothing to connect to.
    if (raw.DATABASE_DIRECT_URL !== undefined) problems.push('DATABASE_DIRECT_URL is set without DATABASE_URL; set both, or neither for the embedded database')
    if (raw.DATABASE_POOLER === 'transaction') problems.push('DATABASE_POOLER=transaction needs DATABASE_URL (the pooler) and DATABASE_DIRECT_URL')
  } else if (raw.DATABASE_POOLER === 'transaction' && (raw.DATABASE_DIRECT_URL === undefined || raw.DATABASE_DIRECT_URL === raw.DATABASE_URL)) {
    // LISTEN and the migrations' lock are session state: through the pooler they would be lost.
    problems.push('DATABASE_POOLER=transaction needs DATABASE_DIRECT_URL, a connection that bypasses the pooler (for LISTEN and migrations), other than DATABASE_URL')
  }
  // A replica of what? The embedded database has none.
  if (raw.DATABASE_READ_URL !== undefined && raw.DATABASE_URL === undefined) problems.push('DATABASE_READ_URL needs DATABASE_URL (a replica of the PostgreSQL it names)')
  let sealingKeys: SealingKey[] | undefined
  if (typeof raw.SEALING_KEYS === 'string') {
    try {
      sealingKeys = parseSealingKeys(raw.SEALING_KEYS)
    } catch (err) {
      problems.push(`SEALING_KEYS: ${(err as Error).message}`)
    }
  }
  if (problems.length > 0) throw new ConfigError(`Invalid configuration: ${problems.join('; ')}`)

  const e = Value.Default(ConfigSchema, raw) as Env
  const pooler = e.DATABASE_POOLER === 'auto'
    ? e.DATABASE_DIRECT_URL !== undefined && e.DATABASE_DIRECT_URL !== e.DATABASE_URL ? 'transaction' : 'none'
    : e.DATABASE_POOLER
  return {
    host: e.HOST,
    port: e.PORT,
    metricsPort: e.METRICS_PORT,
    databaseUrl: e.DATABASE_URL,
    databasePoolSize: e.DATABASE_POOL_SIZE,
    listenHeartbeatMs: e.LISTEN_HEARTBEAT_MS,
    databaseDirectUrl: e.DATABASE_DIRECT_URL,
    databasePooler: pooler,
    dataDir: e.DATA_DIR,
    databaseReadUrl: e.DATABASE_READ_URL,
    databaseReadMaxWaitMs: e.DATABASE_READ_MAX_WAIT_MS,
    redisUrl: e.REDIS_URL,
    logLevel: e.LOG_LEVEL,
    trustProxy: parseTrustProxy(e.TRUST_PROXY),
    dailyMessageQuota: e.DAILY_MESSAGE_QUOTA,
    rateLimitPerSecond: e.RATE_LIMIT_PER_SECOND,
    maxBodyChars: e.MAX_BODY_CHARS,
    messageEditWindowSeconds: e.MESSAGE_EDIT_WINDOW_SECONDS,
    maxAttachments: e.MAX_ATTACHMENTS,
    maxAttachmentBytes: e.MAX_ATTACHMENT_BYTES,
    maxLongPollsPerKey: e.MAX_LONG_POLLS_PER_KEY,
    eventStreamHeartbeatSeconds: e.EVENT_STREAM_HEARTBEAT_SECONDS,
    requestTimeoutSeconds: e.REQUEST_TIMEOUT_SECONDS,
    maxGroupMembers: e.MAX_GROUP_MEMBERS,
    auditRetentionDays: e.AUDIT_RETENTION_DAYS,
    exportMaxSeconds: e.EXPORT_MAX_SECONDS,
    messageRetentionDays: e.MESSAGE_RETENTION_DAYS,
    webhookAllowPrivate: e.WEBHOOK_ALLOW_PRIVATE === 'true',
    webhookSecretsKey: e.WEBHOOK_SECRETS_KEY === undefined ? undefined : Buffer.from(e.WEBHOOK_SECRETS_KEY, 'hex'),
    sealingKeys,
    testBotAddress: e.TEST_BOT_ADDRESS
  }
}
