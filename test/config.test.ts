import t from 'tap'
import { ConfigError, loadConfig } from '../src/config.js'

t.test('defaults follow API.md §8 and §2', async (t) => {
  t.same(loadConfig({}), {
    host: '127.0.0.1',
    port: 3000,
    databaseUrl: undefined,
    databasePoolSize: 10,
    listenHeartbeatMs: 15_000,
    databaseDirectUrl: undefined,
    databasePooler: 'none',
    dataDir: './data',
    databaseReadMaxWaitMs: 50,
    redisUrl: undefined,
    logLevel: 'info',
    trustProxy: false,
    dailyMessageQuota: 100,
    rateLimitPerSecond: 20,
    maxBodyChars: 10_000,
    messageEditWindowSeconds: 86_400,
    maxAttachments: 10,
    maxAttachmentBytes: 25 * 1024 * 1024,
    maxLongPollsPerKey: 10,
    requestTimeoutSeconds: 60,
    maxGroupMembers: 1_000,
    auditRetentionDays: 365,
    exportMaxSeconds: 3_600,
    messageRetentionDays: undefined,
    webhookAllowPrivate: false,
    webhookSecretsKey: undefined,
    eventStreamHeartbeatSeconds: 15,
    testBotAddress: 'testbot'
  })
})

t.test('values are read and coerced; empty strings count as unset', async (t) => {
  const config = loadConfig({
    HOST: '0.0.0.0',
    PORT: '8080',
    DATABASE_URL: 'postgres://u:p@db:5432/parley',
    DATA_DIR: '/var/lib/parley',
    REDIS_URL: 'redis://cache:6379',
    LOG_LEVEL: 'debug',
    TRUST_PROXY: '2',
    DAILY_MESSAGE_QUOTA: '500',
    RATE_LIMIT_PER_SECOND: '50',
    MAX_BODY_CHARS: '2000',
    MESSAGE_EDIT_WINDOW_SECONDS: '0',
    AUDIT_RETENTION_DAYS: '30',
    EXPORT_MAX_SECONDS: '600',
    MESSAGE_RETENTION_DAYS: '90',
    MAX_ATTACHMENTS: '3',
    MAX_ATTACHMENT_BYTES: '1024',
    TEST_BOT_ADDRESS: 'echo-bot',
    LOG_FORMAT: 'ignored'
  })
  t.match(config, {
    host: '0.0.0.0',
    port: 8080,
    databaseUrl: 'postgres://u:p@db:5432/parley',
    dataDir: '/var/lib/parley',
    redisUrl: 'redis://cache:6379',
    logLevel: 'debug',
    trustProxy: 2,
    dailyMessageQuota: 500,
    rateLimitPerSecond: 50,
    maxBodyChars: 2000,
    messageEditWindowSeconds: 0,
    auditRetentionDays: 30,
    exportMaxSeconds: 600,
    messageRetentionDays: 90,
    maxAttachments: 3,
    maxAttachmentBytes: 1024,
    testBotAddress: 'echo-bot'
  })
  t.equal(loadConfig({ PORT: '' }).port, 3000)
  t.equal(loadConfig({ TRUST_PROXY: 'true' }).trustProxy, true)
  t.same(loadConfig({ TRUST_PROXY: '10.0.0.0/8,127.0.0.1' }).trustProxy, ['10.0.0.0/8', '127.0.0.1'])
})

t.test('a bad value throws one line naming the variable and what it accepts', async (t) => {
  const cases: [Record<string, string>, RegExp][] = [
    [{ PORT: 'abc' }, /PORT must be an integer from 0 to 65535 \(got "abc"\)/],
    [{ PORT: '70000' }, /PORT must be an integer from 0 to 65535/],
    [{ LOG_LEVEL: 'loud' }, /LOG_LEVEL must be one of fatal, error, warn, info, debug, trace, silent/],
    [{ DAILY_MESSAGE_QUOTA: '-1' }, /DAILY_MESSAGE_QUOTA must be an integer/],
    [{ MESSAGE_EDIT_WINDOW_SECONDS: '-1' }, /MESSAGE_EDIT_WINDOW_SECONDS must be an integer number of seconds from 0 to 315360000/],
    [{ RATE_LIMIT_PER_SECOND: '0' }, /RATE_LIMIT_PER_SECOND must be an integer from 1/],
    [{ AUDIT_RETENTION_DAYS: '0' }, /AUDIT_RETENTION_DAYS must be an integer number of days from 1 to 36500 \(got "0"\)/],
    [{ AUDIT_RETENTION_DAYS: '1y' }, /AUDIT_RETENTION_DAYS must be an integer number of days/],
    [{ MESSAGE_RETENTION_DAYS: '0' }, /MESSAGE_RETENTION_DAYS must be an integer number of days from 1 to 36500 \(got "0"\)/],
    [{ MESSAGE_RETENTION_DAYS: '36501' }, /MESSAGE_RETENTION_DAYS must be an integer number of days from 1 to 36500/],
    [{ MESSAGE_RETENTION_DAYS: '30d' }, /MESSAGE_RETENTION_DAYS must be an integer number of days/],
    [{ MAX_ATTACHMENT_BYTES: '1.5' }, /MAX_ATTACHMENT_BYTES must be an integer/],
    [{ TEST_BOT_ADDRESS: 'Bad_Bot' }, /TEST_BOT_ADDRESS must be a user address/],
    [{ TRUST_PROXY: 'maybe' }, /TRUST_PROXY must be true, false, a hop count/],
    [{ DATABASE_URL: 'mysql://root:hunter2@db/x' }, /DATABASE_URL must be a PostgreSQL connection URL/],
    [{ REDIS_URL: 'http://secret@cache' }, /REDIS_URL must be a Redis URL/]
  ]
  for (const [env, message] of cases) {
    const name = Object.keys(env)[0]!
    t.throws(() => loadConfig(env), ConfigError, name)
    try {
      loadConfig(env)
    } catch (err) {
      const text = (err as Error).message
      t.match(text, message, name)
      t.notMatch(text, /\n/, `${name}: one line`)
    }
  }
})

t.test('URLs that may hold passwords are never echoed back', async (t) => {
  try {
    loadConfig({ DATABASE_URL: 'mysql://root:hunter2@db/x', REDIS_URL: 'http://user:s3cret@cache' })
    t.fail('should throw')
  } catch (err) {
    t.notMatch((err as Error).message, /hunter2|s3cret/)
    t.match((err as Error).message, /DATABASE_URL.*; REDIS_URL/, 'every bad variable in the one line')
  }
})

t.test('DATABASE_URL_FILE and REDIS_URL_FILE read secrets from files (Docker secrets)', async (t) => {
  const dir = t.testdir({ db: 'postgres://parley:s3cret@db:5432/parley\n', redis: 'redis://:pw@cache:6379' })
  const config = loadConfig({ DATABASE_URL_FILE: `${dir}/db`, REDIS_URL_FILE: `${dir}/redis` })
  t.equal(config.databaseUrl, 'postgres://parley:s3cret@db:5432/parley', 'the trailing newline is dropped')
  t.equal(config.redisUrl, 'redis://:pw@cache:6379')
  t.throws(() => loadConfig({ DATABASE_URL_FILE: `${dir}/db`, DATABASE_URL: 'postgres://x@y/z' }),
    new ConfigError('Invalid configuration: DATABASE_URL and DATABASE_URL_FILE are both set; give one'))
  t.throws(() => loadConfig({ DATABASE_URL_FILE: `${dir}/missing` }), /DATABASE_URL_FILE must name a readable file \(ENOENT/)
  const bad = t.testdir({ db: 'mysql://root:hunter2@db/x' })
  const refused = (() => { try { loadConfig({ DATABASE_URL_FILE: `${bad}/db` }) } catch (err) { return (err as Error).message } })()
  t.match(refused, /^Invalid configuration: DATABASE_URL must be a PostgreSQL connection URL/)
  t.notMatch(refused, /hunter2/, 'a bad secret is named, never echoed')
})

t.test('DATABASE_DIRECT_URL and DATABASE_POOLER (API.md §12): a pooler in front, a session connection past it', async (t) => {
  const pooled = 'postgres://parley:s3cret@pgbouncer:6432/parley'
  const direct = 'postgres://parley:s3cret@db:5432/parley'
  t.match(loadConfig({ DATABASE_URL: pooled, DATABASE_DIRECT_URL: direct }), { databaseUrl: pooled, databaseDirectUrl: direct, databasePooler: 'transaction' },
    'auto: a direct URL other than DATABASE_URL means DATABASE_URL is a transaction pooler')
  t.match(loadConfig({ DATABASE_URL: direct, DATABASE_DIRECT_URL: direct }), { databasePooler: 'none' }, 'auto: the same URL twice is no pooler')
  t.match(loadConfig({ DATABASE_URL: direct }), { databaseDirectUrl: undefined, databasePooler: 'none' }, 'auto: no direct URL, no pooler')
  t.match(loadConfig({ DATABASE_URL: pooled, DATABASE_DIRECT_URL: direct, DATABASE_POOLER: 'none' }), { databasePooler: 'none' }, 'none overrides auto (a session pooler)')
  t.match(loadConfig({ DATABASE_URL: pooled, DATABASE_DIRECT_URL: direct, DATABASE_POOLER: 'transaction' }), { databasePooler: 'transaction' }, 'transaction is taken as said')

  const refusal = (env: Record<string, string>) => { try { loadConfig(env); return '' } catch (err) { return (err as Error).message } }
  t.match(refusal({ DATABASE_URL: pooled, DATABASE_POOLER: 'transaction' }), /^Invalid configuration: DATABASE_POOLER=transaction needs DATABASE_DIRECT_URL/,
    'a transaction pooler without a way past it for LISTEN and migrations is refused at start')
  t.match(refusal({ DATABASE_URL: pooled, DATABASE_DIRECT_URL: pooled, DATABASE_POOLER: 'transaction' }), /DATABASE_DIRECT_URL.*other than DATABASE_URL/,
    'and so is a "way past it" that is the pooler itself')
  t.match(refusal({ DATABASE_DIRECT_URL: direct }), /DATABASE_DIRECT_URL is set without DATABASE_URL/)
  t.match(refusal({ DATABASE_URL: pooled, DATABASE_POOLER: 'session' }), /DATABASE_POOLER must be one of auto, transaction, none \(got "session"\)/)
  const bad = refusal({ DATABASE_URL: pooled, DATABASE_DIRECT_URL: 'mysql://root:hunter2@db/x' })
  t.match(bad, /DATABASE_DIRECT_URL must be a PostgreSQL connection URL/)
  t.notMatch(bad, /hunter2/, 'a bad direct URL is named, never echoed')

  const dir = t.testdir({ direct: `${direct}\n` })
  t.equal(loadConfig({ DATABASE_URL: pooled, DATABASE_DIRECT_URL_FILE: `${dir}/direct` }).databaseDirectUrl, direct, 'DATABASE_DIRECT_URL_FILE (Docker secrets)')
})

t.test('WEBHOOK_SECRETS_KEY: 32 bytes as hex, from the environment or a file, never echoed', async (t) => {
  const key = 'ab'.repeat(32)
  t.same(loadConfig({ WEBHOOK_SECRETS_KEY: key }).webhookSecretsKey, Buffer.from(key, 'hex'))
  t.equal(loadConfig({}).webhookSecretsKey, undefined, 'unset by default')
  const dir = t.testdir({ key: `${key}\n` })
  t.same(loadConfig({ WEBHOOK_SECRETS_KEY_FILE: `${dir}/key` }).webhookSecretsKey, Buffer.from(key, 'hex'))
  const short = 'cd'.repeat(20)
  const refused = (() => { try { loadConfig({ WEBHOOK_SECRETS_KEY: short }) } catch (err) { return (err as Error).message } })()
  t.match(refused, /^Invalid configuration: WEBHOOK_SECRETS_KEY must be 64 hexadecimal digits/)
  t.notMatch(refused, short, 'the bad value is not echoed')
})

t.test('DATABASE_READ_URL: a replica of DATABASE_URL, from the environment or a file, never echoed', async (t) => {
  const primary = 'postgres://parley:pw@db:5432/parley'
  const config = loadConfig({ DATABASE_URL: primary, DATABASE_READ_URL: 'postgres://parley:pw@replica:5432/parley', DATABASE_READ_MAX_WAIT_MS: '100' })
  t.equal(config.databaseReadUrl, 'postgres://parley:pw@replica:5432/parley')
  t.equal(config.databaseReadMaxWaitMs, 100)
  t.equal(loadConfig({ DATABASE_URL: primary }).databaseReadUrl, undefined, 'unset by default')
  const dir = t.testdir({ read: 'postgres://parley:s3cret@replica:5432/parley\n' })
  t.equal(loadConfig({ DATABASE_URL: primary, DATABASE_READ_URL_FILE: `${dir}/read` }).databaseReadUrl, 'postgres://parley:s3cret@replica:5432/parley')
  t.throws(() => loadConfig({ DATABASE_READ_URL: 'postgres://x@replica/parley' }),
    new ConfigError('Invalid configuration: DATABASE_READ_URL needs DATABASE_URL (a replica of the PostgreSQL it names)'))
  const refused = (() => { try { loadConfig({ DATABASE_URL: primary, DATABASE_READ_URL: 'mysql://root:hunter2@replica/x' }) } catch (err) { return (err as Error).message } })()
  t.match(refused, /^Invalid configuration: DATABASE_READ_URL must be a PostgreSQL connection URL of a streaming replica/)
  t.notMatch(refused, /hunter2/, 'a bad secret is named, never echoed')
  t.throws(() => loadConfig({ DATABASE_URL: primary, DATABASE_READ_MAX_WAIT_MS: '20000' }), /DATABASE_READ_MAX_WAIT_MS must be an integer number of milliseconds from 0 to 10000/)
})
