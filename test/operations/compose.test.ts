import { execFile } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { promisify } from 'node:util'
import t from 'tap'
import { loadConfig } from '../../src/config.js'
import { emptyPostgresDatabase, usingPostgres } from '../support/databases.js'
import { runCli, startServer } from '../support/processes.js'

const compose = readFileSync('docker-compose.yml', 'utf8')
const dockerfile = readFileSync('Dockerfile', 'utf8')

/**
 * The variables of a YAML mapping block, `${VAR:-default}` read as its default and a required
 * `${POSTGRES_PASSWORD:?…}` as the value an operator's .env would give it.
 */
function environmentBlock (anchorLine: string): Record<string, string> {
  const lines = compose.split('\n')
  const start = lines.findIndex((line) => line.startsWith(anchorLine))
  const env: Record<string, string> = {}
  for (const line of lines.slice(start + 1)) {
    const match = /^ {2}([A-Z_]+): (.*)$/.exec(line)
    if (match === null) break
    env[match[1]!] = match[2]!.replace(/^"|"$/g, '').replace(/\$\{[A-Z_]+:-([^}]*)\}/g, '$1').replace(/\$\{POSTGRES_PASSWORD:\?[^}]*\}/g, 'secret')
  }
  return env
}

const composeEnv = { ...environmentBlock('x-parley-env:'), HOST: '0.0.0.0', PORT: '3000' }

t.test('the compose file wires postgres → migrate → app with health checks', async (t) => {
  t.match(compose, /postgres:\n {4}image: postgres:\d+/)
  t.match(compose, /volumes:\n {6}- pgdata:\/var\/lib\/postgresql\/data/)
  t.match(compose, /migrate:[\s\S]*command: \["node", "bin\/parley.js", "migrate"\]/)
  t.match(compose, /app:[\s\S]*migrate:\n {8}condition: service_completed_successfully/)
  t.match(compose, /app:[\s\S]*postgres:\n {8}condition: service_healthy/)
  t.match(compose, /redis:\n {4}image: redis:[\s\S]*profiles: \["scale"\]/)
  t.match(dockerfile, /^USER node$/m, 'runs as a non-root user')
  t.match(dockerfile, /^HEALTHCHECK .*\n.*\/healthz/m, 'the container probes liveness; readiness is for load balancers')
  t.match(dockerfile, /^ARG NODE_IMAGE=node:24\.\d+\.\d+-bookworm-slim$/m, 'Node.js 24 (LTS), an exact release')
  t.equal(dockerfile.match(/^FROM /gm)?.length, dockerfile.match(/^FROM \$\{NODE_IMAGE\}/gm)?.length, 'every stage on that image')
  t.equal(compose.match(/^ {4}build: \./gm)?.length, 1, 'the image is built once')
  t.notMatch(compose, /POSTGRES_PASSWORD:-/, 'no fallback database password')
  t.match(compose, /POSTGRES_PASSWORD: \$\{POSTGRES_PASSWORD:\?/)
  t.match(dockerfile, /npm ci --omit=dev/)
  t.match(dockerfile, /^CMD \["node", "bin\/parley.js", "serve"\]$/m)
})

t.test('the compose file\'s settings are a valid configuration', async (t) => {
  t.same(Object.keys(composeEnv).sort(), ['DAILY_MESSAGE_QUOTA', 'DATABASE_URL', 'HOST', 'LOG_LEVEL', 'PORT', 'RATE_LIMIT_PER_SECOND', 'REDIS_URL', 'TRUST_PROXY'])
  const config = loadConfig(composeEnv)
  t.match(config, { host: '0.0.0.0', port: 3000, databaseUrl: 'postgres://parley:secret@postgres:5432/parley', redisUrl: undefined, trustProxy: false })
})

t.test('what the containers run works outside Docker: parley migrate, then parley serve, with the compose settings', {
  skip: usingPostgres() ? false : 'needs DATABASE_URL (the compose file runs on PostgreSQL)'
}, async (t) => {
  // The compose settings, with the database this test made and a free loopback port.
  const empty = await emptyPostgresDatabase()
  t.teardown(() => empty.drop())
  const env = { ...composeEnv, DATABASE_URL: empty.url, HOST: '127.0.0.1', PORT: '0' }
  const migrate = await runCli(['migrate'], env)
  t.equal(migrate.code, 0, migrate.stderr)
  t.match(migrate.stdout, /Applied \d+ migration\(s\)/)
  const server = await startServer(t, env)
  t.equal((await fetch(`${server.url}/readyz`)).status, 200)
  t.equal(await server.stop(), 0)
})

const composeTool = await promisify(execFile)('docker', ['compose', 'version']).then(() => ['docker', 'compose'],
  () => promisify(execFile)('docker-compose', ['version']).then(() => ['docker-compose'], () => undefined))

t.test('docker compose config accepts the file with POSTGRES_PASSWORD and refuses it without', { skip: composeTool === undefined ? 'no docker compose here' : false }, async (t) => {
  const [command, ...args] = composeTool!
  const env = { ...process.env, POSTGRES_PASSWORD: 'secret' }
  const { stdout } = await promisify(execFile)(command!, [...args, 'config'], { env })
  t.match(stdout, /service_completed_successfully/)
  const { POSTGRES_PASSWORD: _, ...without } = env
  await t.rejects(promisify(execFile)(command!, [...args, 'config'], { env: without }), /POSTGRES_PASSWORD/)
})
