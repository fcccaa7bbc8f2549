import { execFile, spawn } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { request } from 'node:http'
import { join } from 'node:path'
import { promisify } from 'node:util'
import pg from 'pg'
import t from 'tap'
import { loadConfig } from '../../src/config.js'
import { emptyPostgresDatabase, usingPostgres } from '../support/databases.js'
import { longPollsWaiting } from '../support/metrics.js'
import { childDatabaseEnv, runCli, runCliInProcess, serveNodeArgs, spawnDaemon, startServer, tempDir } from '../support/processes.js'
import { freePort } from '../support/ports.js'
import { TEST_SEALING_KEYS } from '../support/sealing.js'
import { until } from '../support/until.js'

const run = promisify(execFile)
const compose = readFileSync('docker-compose.yml', 'utf8')
const dockerfile = readFileSync('Dockerfile', 'utf8')
const pgbouncerDockerfile = readFileSync('deploy/pgbouncer/Dockerfile', 'utf8')
const nginx = readFileSync('deploy/nginx.conf', 'utf8')
const balancerCaddyfile = readFileSync('deploy/balancer.Caddyfile', 'utf8')
const tlsCaddyfile = readFileSync('deploy/Caddyfile', 'utf8')

/** Every variable src/config.ts reads: the properties of its ConfigSchema. */
const configVariables = (() => {
  const source = readFileSync('src/config.ts', 'utf8')
  const schema = /const ConfigSchema = Type\.Object\(\{\n([\s\S]*?)\n\}\)\n/.exec(source)![1]!
  return [...schema.matchAll(/^ {2}([A-Z][A-Z0-9_]*): /gm)].map((match) => match[1]!)
})()
/** Set by the compose file itself: the proxies find the app on 0.0.0.0:3000; the embedded database's directory is unused there. */
const fixedInCompose: Record<string, string | undefined> = { HOST: '0.0.0.0', PORT: '3000', DATA_DIR: undefined }
/** Built by the compose file from POSTGRES_PASSWORD (and PARLEY_DATABASE_HOST). */
const builtInCompose = new Set(['DATABASE_URL', 'DATABASE_DIRECT_URL'])

t.test('src/config.ts is read for its variables', async (t) => {
  t.ok(configVariables.length >= 20, configVariables.join(' '))
  for (const name of ['HOST', 'PORT', 'DATABASE_URL', 'DATABASE_POOL_SIZE', 'METRICS_PORT', 'MAX_ATTACHMENT_BYTES', 'TEST_BOT_ADDRESS']) t.ok(configVariables.includes(name), name)
})

t.test('the images: Node.js 24 for the app, every base image an exact release', async (t) => {
  t.match(dockerfile, /^USER node$/m, 'runs as a non-root user')
  t.match(dockerfile, /^HEALTHCHECK .*\n.*\/healthz/m, 'the container probes liveness; readiness is for load balancers')
  t.match(dockerfile, /^ARG NODE_IMAGE=node:24\.\d+\.\d+-bookworm-slim$/m, 'Node.js 24 (LTS), an exact release')
  t.equal(dockerfile.match(/^FROM /gm)?.length, dockerfile.match(/^FROM \$\{NODE_IMAGE\}/gm)?.length, 'every stage on that image')
  const floor = /^>=(\d+)\./.exec((JSON.parse(readFileSync('package.json', 'utf8')) as { engines: { node: string } }).engines.node)
  t.ok(floor !== null && Number(floor[1]) <= 24, 'the image runs a Node.js the engines floor admits')
  t.match(dockerfile, /npm ci --omit=dev/)
  const command = /^CMD (\[.*\])$/m.exec(dockerfile)?.[1]
  t.same(command === undefined ? undefined : JSON.parse(command), ['node', ...serveNodeArgs(), 'bin/parley.js', 'serve'],
    'the image serves as `npm start` does, with its V8 heap budget')
  t.ok(serveNodeArgs().some((arg) => arg.startsWith('--max-old-space-size=')), 'which is set')
  t.match(pgbouncerDockerfile, /^FROM debian:\d+\.\d+-slim$/m, 'PgBouncer on an exact Debian point release')
  t.match(pgbouncerDockerfile, /^USER postgres$/m)
  // image: lines of the compose file, but the two built here.
  const images = [...compose.matchAll(/^ {4}image: (\S+)$/gm)].map((match) => match[1]!).filter((image) => !image.endsWith(':local'))
  t.ok(images.length >= 3, images.join(' '))
  // PostgreSQL's releases have two numbers (16.16), the others three; a digest pins anything.
  for (const image of images) t.match(image, /^postgres:\d+\.\d+-|^[^:]+:\d+\.\d+\.\d+(-[a-z0-9.]+)?$|@sha256:[0-9a-f]{64}$/, `${image} is pinned`)
})

t.test('the nginx example streams uploads and answers, and lets Parley judge the body', async (t) => {
  const directive = (name: string) => new RegExp(`^\\s*${name}\\s+([^;]+);`, 'm').exec(nginx)?.[1]
  t.equal(directive('proxy_request_buffering'), 'off', 'uploads reach Parley as they arrive, not after nginx spooled them to disk')
  t.equal(directive('proxy_buffering'), 'off', 'long-polls, event streams and downloads are not held back')
  t.equal(directive('proxy_http_version'), '1.1', 'needed for unbuffered chunked uploads')
  t.equal(directive('proxy_set_header X-Forwarded-For'), '$remote_addr', 'replaces what clients send')
  const bodyLimit = /^(\d+)m$/.exec(directive('client_max_body_size') ?? '')
  const defaults = loadConfig({})
  t.ok(bodyLimit !== null && Number(bodyLimit[1]) * 1024 * 1024 >= defaults.maxAttachments * defaults.maxAttachmentBytes + 1024 * 1024,
    'client_max_body_size holds the largest send Parley takes by default')
  const readTimeout = /^(\d+)s$/.exec(directive('proxy_read_timeout') ?? '')
  t.ok(readTimeout !== null && Number(readTimeout[1]) > 30, 'longer than the longest long-poll (30 s)')
  t.match(nginx, /location = \/metrics \{ return 404; \}/)
})

t.test('both Caddy configurations balance over every instance and stream', async (t) => {
  for (const [name, file] of [['deploy/balancer.Caddyfile', balancerCaddyfile], ['deploy/Caddyfile', tlsCaddyfile]] as const) {
    t.match(file, /dynamic a \{\$PARLEY_UPSTREAM_HOST:app\} \{\$PARLEY_UPSTREAM_PORT:3000\}/, `${name}: every address of the app service`)
    t.match(file, /lb_policy least_conn/, name)
    t.match(file, /flush_interval -1/, name)
    t.match(file, /respond @metrics 404/, name)
  }
})

/** The compose tool here: Compose v2 (`docker compose`), or Debian's docker-compose (1.29). */
const composeTool = await run('docker', ['compose', 'version']).then(() => ['docker', 'compose'],
  () => run('docker-compose', ['version']).then(() => ['docker-compose'], () => undefined))

interface Port { hostIp: string, published: string, target: string }
interface Service {
  image?: string
  profiles?: string[]
  environment?: Record<string, string | null>
  ports?: (string | { host_ip?: string, published?: string | number, target: number | string, protocol?: string })[]
  expose?: (string | number)[]
}

/**
 * `docker compose [--profile P] config` as data: the services that profile starts, with every
 * variable interpolated from `env` (what an operator's .env would hold). Compose v2 prints JSON
 * and leaves other profiles out; docker-compose 1.29 prints YAML (read with the PyYAML it runs
 * on) with every service, so the profile is applied here as v2 applies it.
 */
async function composeConfig (profiles: string[], env: Record<string, string> = {}): Promise<Record<string, Service>> {
  const [command, ...args] = composeTool!
  const options = { env: { PATH: process.env.PATH, HOME: process.env.HOME, POSTGRES_PASSWORD: 'secret', SEALING_KEYS: TEST_SEALING_KEYS, ...env }, maxBuffer: 4 * 1024 * 1024 }
  const flags = profiles.flatMap((profile) => ['--profile', profile])
  if (command === 'docker') {
    const { stdout } = await run(command, [...args, ...flags, 'config', '--format', 'json'], options)
    return (JSON.parse(stdout) as { services: Record<string, Service> }).services
  }
  const { stdout: yaml } = await run(command!, [...args, ...flags, 'config'], options)
  const json = await new Promise<string>((resolve, reject) => {
    const child = spawn('python3', ['-c', 'import json, sys, yaml; json.dump(yaml.safe_load(sys.stdin), sys.stdout)'], { stdio: ['pipe', 'pipe', 'inherit'] })
    let out = ''
    child.stdout.on('data', (chunk: Buffer) => { out += chunk.toString() })
    child.on('error', reject)
    child.on('close', (code) => code === 0 ? resolve(out) : reject(new Error(`python3 exited with ${code}`)))
    child.stdin.end(yaml)
  })
  const services = (JSON.parse(json) as { services: Record<string, Service> }).services
  return Object.fromEntries(Object.entries(services).filter(([, service]) =>
    service.profiles === undefined || service.profiles.some((profile) => profiles.includes(profile))))
}

/** A service's published ports, short or long syntax, as host address, host port, container port. */
function published (service: Service | undefined): Port[] {
  return (service?.ports ?? []).map((port) => {
    if (typeof port === 'object') return { hostIp: port.host_ip ?? '', published: String(port.published ?? ''), target: String(port.target) }
    const parts = port.replace(/\/(tcp|udp)$/, '').split(':')
    const target = parts.pop()!
    const hostPort = parts.pop() ?? ''
    return { hostIp: parts.join(':'), published: hostPort, target }
  })
}

const needsCompose = { skip: composeTool === undefined ? 'no docker compose here (.ci/run installs Debian\'s docker-compose)' : false }

t.test('docker compose config accepts the file with POSTGRES_PASSWORD and SEALING_KEYS, and refuses it without either', needsCompose, async (t) => {
  const [command, ...args] = composeTool!
  const env = { PATH: process.env.PATH, HOME: process.env.HOME }
  await t.rejects(run(command!, [...args, 'config'], { env: { ...env, SEALING_KEYS: TEST_SEALING_KEYS } }), /POSTGRES_PASSWORD/)
  await t.rejects(run(command!, [...args, 'config'], { env: { ...env, POSTGRES_PASSWORD: 'secret' } }), /SEALING_KEYS/)
  const services = await composeConfig([])
  t.same(Object.keys(services).sort(), ['app', 'balancer', 'migrate', 'postgres'])
  t.same(services.app!.environment!.DATABASE_URL, 'postgres://parley:secret@postgres:5432/parley')
  t.same(services.migrate!.environment!.SEALING_KEYS, TEST_SEALING_KEYS, 'migrate seals what was written before sealing: it needs the keys too')
})

t.test('the default stack publishes one port, on loopback, through the balancer', needsCompose, async (t) => {
  const services = await composeConfig([])
  t.same(published(services.app), [], 'the app publishes nothing')
  t.same(published(services.balancer), [{ hostIp: '127.0.0.1', published: '3000', target: '3000' }])
  for (const [name, service] of Object.entries(services)) {
    for (const port of published(service)) t.equal(port.hostIp, '127.0.0.1', `${name} publishes ${port.published} on loopback only`)
  }
  const moved = await composeConfig([], { PARLEY_PORT: '8080' })
  t.same(published(moved.balancer), [{ hostIp: '127.0.0.1', published: '8080', target: '3000' }], 'PARLEY_PORT moves it')
})

t.test('--profile scale: the app has no fixed host port, so --scale app=3 can start, and Redis joins', needsCompose, async (t) => {
  const services = await composeConfig(['scale'])
  t.ok(services.redis, 'redis')
  t.ok(services.balancer, 'the balancer in front')
  t.same(published(services.app), [], 'no host port on app')
  t.same(published(services.redis), [])
  t.same(published(services.balancer), [{ hostIp: '127.0.0.1', published: '3000', target: '3000' }])
})

t.test('--profile tls: Caddy on 80 and 443 in front; the balancer stays on loopback', needsCompose, async (t) => {
  const services = await composeConfig(['tls'])
  t.same(published(services.caddy).map((port) => port.published).sort(), ['443', '443', '80'])
  t.same(published(services.app), [])
  t.same(published(services.balancer).map((port) => port.hostIp), ['127.0.0.1'])
  t.equal(services.app!.environment!.TRUST_PROXY, '1', 'one proxy in front, and no way around it')
})

t.test('--profile pooler: PgBouncer in between, LISTEN and migrations straight to PostgreSQL', needsCompose, async (t) => {
  const services = await composeConfig(['pooler'], { PARLEY_DATABASE_HOST: 'pgbouncer:6432' })
  t.ok(services.pgbouncer, 'pgbouncer')
  t.same(published(services.pgbouncer), [])
  t.equal(services.app!.environment!.DATABASE_URL, 'postgres://parley:secret@pgbouncer:6432/parley')
  t.equal(services.app!.environment!.DATABASE_DIRECT_URL, 'postgres://parley:secret@postgres:5432/parley')
  t.equal(services.migrate!.environment!.DATABASE_URL, 'postgres://parley:secret@postgres:5432/parley', 'migrations take a session lock')
  t.equal(services.pgbouncer!.environment!.PGBOUNCER_PASSWORD, 'secret')
  t.equal(services.pgbouncer!.environment!.PGBOUNCER_UPSTREAM_HOST, 'postgres')
})

t.test('every variable of src/config.ts reaches the app from .env, and metrics stay unpublished', needsCompose, async (t) => {
  const defaults = (await composeConfig([])).app!.environment!
  for (const name of configVariables) {
    if (name in fixedInCompose) {
      t.equal(defaults[name] ?? undefined, fixedInCompose[name], `${name} is fixed by the compose file`)
    } else {
      t.ok(name in defaults, `${name} is passed through`)
    }
  }
  // What an operator's .env sets arrives as it is.
  const passed = configVariables.filter((name) => !(name in fixedInCompose) && !builtInCompose.has(name))
  const given = Object.fromEntries(passed.map((name) => [name, name === 'METRICS_PORT' ? '9999' : `from-env-${name.toLowerCase()}`]))
  const app = (await composeConfig([], given)).app!
  for (const name of passed) t.equal(app.environment![name], given[name], `.env sets ${name}`)

  // Unset, each is empty (the app's own default) or the compose file's, and together valid.
  const env = Object.fromEntries(Object.entries(defaults).map(([name, value]) => [name, value ?? '']))
  const config = loadConfig(env)
  t.match(config, { host: '0.0.0.0', port: 3000, metricsPort: 9464, trustProxy: 1, databasePoolSize: 10, maxAttachmentBytes: 25 * 1024 * 1024 })
  for (const profiles of [[], ['scale'], ['tls'], ['pooler']]) {
    const services = await composeConfig(profiles)
    const ports = Object.values(services).flatMap((service) => published(service))
    t.notOk(ports.some((port) => port.target === '9464' || port.published === '9464'), `metrics not published (${profiles.join(' ') || 'default'})`)
  }
  t.ok(defaults.METRICS_PORT !== '' && defaults.METRICS_PORT !== '3000', 'metrics on a port of their own')
})

/** The app's environment as the compose file gives it, with no .env but POSTGRES_PASSWORD. */
async function composeAppEnv (): Promise<Record<string, string>> {
  if (composeTool !== undefined) {
    const env = (await composeConfig([])).app!.environment!
    return Object.fromEntries(Object.entries(env).map(([name, value]) => [name, value ?? '']))
  }
  // No compose here: the x-parley-env block read by hand, `${NAME:-default}` as its default.
  const lines = compose.split('\n')
  const env: Record<string, string> = { HOST: '0.0.0.0', PORT: '3000' }
  for (const line of lines.slice(lines.findIndex((line) => line.startsWith('x-parley-env:')) + 1)) {
    if (/^ {2}#/.test(line)) continue
    const match = /^ {2}([A-Z_]+): (.*)$/.exec(line)
    if (match === null) break
    env[match[1]!] = match[2]!.startsWith('*')
      ? 'postgres://parley:secret@postgres:5432/parley'
      : match[2]!.replace(/\$\{[A-Z_]+:-([^}]*)\}/g, '$1').replace(/^\$\{SEALING_KEYS:\?[^}]*\}$/, TEST_SEALING_KEYS)
  }
  return env
}

t.test('what the containers run works outside Docker: parley migrate, then parley serve, with the compose settings', {
  skip: usingPostgres() ? false : 'needs DATABASE_URL (the compose file runs on PostgreSQL)'
}, async (t) => {
  // The compose settings, with the database this test made and free loopback ports.
  const empty = await emptyPostgresDatabase()
  t.teardown(() => empty.drop())
  const env = { ...await composeAppEnv(), DATABASE_URL: empty.url, DATABASE_DIRECT_URL: empty.url, HOST: '127.0.0.1', PORT: '0', METRICS_PORT: '0' }
  const migrate = await runCli(['migrate'], env)
  t.equal(migrate.code, 0, migrate.stderr)
  t.match(migrate.stdout, /Applied \d+ migration\(s\)/)
  const server = await startServer(t, env)
  t.equal((await fetch(`${server.url}/readyz`)).status, 200)
  t.equal((await fetch(`${server.url}/metrics`)).status, 404, 'with METRICS_PORT, the API port does not serve metrics')
  const logged = () => /Metrics listening at (http:\/\/127\.0\.0\.1:\d+\/metrics)/.exec(server.output())?.[1]
  await until(() => logged() !== undefined, { intervalMs: 50, message: 'the metrics address logged' })
  t.equal((await fetch(logged()!)).status, 200, 'its own port does')
  t.equal(await server.stop(), 0)
})

const caddy = await run('caddy', ['version']).then(() => true, () => false)

t.test('the balancer (deploy/balancer.Caddyfile, in Debian\'s Caddy) in front of parley serve with the compose settings', {
  skip: caddy ? false : 'Caddy is not installed (Debian package caddy); .ci/run installs it'
}, async (t) => {
  const env = { ...await composeAppEnv(), ...await childDatabaseEnv(t), HOST: '127.0.0.1', PORT: '0', METRICS_PORT: '0', LOG_LEVEL: 'info' }
  // The suite's database: its PostgreSQL one for both URLs, or an embedded one for neither.
  const database: Record<string, string | undefined> = env
  if (usingPostgres()) database.DATABASE_DIRECT_URL = database.DATABASE_URL
  else for (const name of ['DATABASE_URL', 'DATABASE_DIRECT_URL']) delete database[name]
  t.equal((await runCliInProcess(['user', 'create', 'alice'], env)).code, 0)
  t.equal((await runCliInProcess(['user', 'create', 'bob'], env)).code, 0)
  const keyOf = async (user: string) => JSON.parse((await runCliInProcess(['key', 'create', user, '--json'], env)).stdout) as { keyId: string, secret: string }
  const [alice, bob] = [await keyOf('alice'), await keyOf('bob')]
  const server = await startServer(t, env)

  const home = tempDir(t, 'parley-balancer-')
  const port = await freePort()
  const proxy = spawnDaemon(t, 'caddy', ['run', '--config', 'deploy/balancer.Caddyfile', '--adapter', 'caddyfile'], {
    PATH: process.env.PATH,
    HOME: home,
    XDG_DATA_HOME: join(home, 'data'),
    XDG_CONFIG_HOME: join(home, 'config'),
    BALANCER_PORT: String(port),
    CADDY_ADMIN: 'off',
    PARLEY_UPSTREAM_HOST: '127.0.0.1',
    PARLEY_UPSTREAM_PORT: new URL(server.url).port
  })

  const base = `http://127.0.0.1:${port}`
  let ready: Response | undefined
  await until(async () => {
    ready = await fetch(`${base}/healthz`).catch(() => undefined)
    return ready?.status === 200
  }, { intervalMs: 50 }).catch(() => {})
  t.equal(ready?.status, 200, ready?.status === 200 ? 'the balancer answers' : `the balancer never answered:\n${proxy.output()}`)
  if (ready?.status !== 200) return
  t.equal((await fetch(`${base}/metrics`)).status, 404, 'no metrics through the balancer')
  t.equal((await fetch(`${base}/readyz`)).status, 200)

  const auth = (key: { keyId: string, secret: string }) => `Basic ${Buffer.from(`${key.keyId}:${key.secret}`).toString('base64')}`
  // From 127.0.0.2, with a forged X-Forwarded-For: Parley logs the balancer's peer, the client.
  const whoami = await new Promise<number>((resolve, reject) => {
    const req = request(`${base}/v2/whoami`, { localAddress: '127.0.0.2', headers: { authorization: auth(alice), 'x-forwarded-for': '203.0.113.9' } }, (res) => {
      res.resume()
      res.on('end', () => resolve(res.statusCode ?? 0))
    })
    req.on('error', reject)
    req.end()
  })
  t.equal(whoami, 200)
  // The request's own log line, as it reaches this process.
  await until(() => server.output().includes('"url":"/v2/whoami"'), { message: 'the request logged' })
  t.match(server.output(), /"remoteAddress":"127\.0\.0\.2"/, 'logged with the client\'s address (TRUST_PROXY=1: the balancer\'s X-Forwarded-For)')
  t.notMatch(server.output(), /203\.0\.113\.9/, 'a forged X-Forwarded-For does not get through')

  // A long-poll through the balancer wakes as soon as the message is sent: nothing holds the answer back.
  const polled = Date.now()
  const poll = fetch(`${base}/v2/events?wait=20`, { headers: { authorization: auth(bob) } }).then(async (res) => ({ status: res.status, body: await res.text(), ms: Date.now() - polled }))
  const metricsAt = () => /Metrics listening at (http:\/\/127\.0\.0\.1:\d+\/metrics)/.exec(server.output())?.[1]
  await until(() => metricsAt() !== undefined, { message: 'the metrics address logged' })
  await until(async () => await longPollsWaiting(metricsAt()!) === 1, { message: 'bob\'s long-poll waiting' })
  const sent = await fetch(`${base}/v2/message`, {
    method: 'POST',
    headers: { authorization: auth(alice), 'content-type': 'application/json' },
    body: JSON.stringify({ recipient: 'bob', body: 'through the balancer' })
  })
  t.equal(sent.status, 200, await sent.clone().text())
  const woken = await poll
  t.equal(woken.status, 200)
  t.match(woken.body, /through the balancer/)
  t.ok(woken.ms < 10_000, `the long-poll woke after ${woken.ms} ms, not at its 20 s end`)
})

const pgbouncer = await run('sh', ['-c', 'command -v pgbouncer || test -x /usr/sbin/pgbouncer']).then(() => true, () => false)

t.test('deploy/pgbouncer/entrypoint.sh runs Debian\'s PgBouncer in transaction mode, with SCRAM, in front of PostgreSQL', {
  skip: !usingPostgres() ? 'needs DATABASE_URL (PgBouncer in front of PostgreSQL)' : !pgbouncer ? 'pgbouncer is not installed (Debian package pgbouncer)' : false
}, async (t) => {
  const upstream = new URL(process.env.DATABASE_URL!)
  const dir = tempDir(t, 'parley-compose-pgbouncer-')
  const port = await freePort()
  const database = upstream.pathname.slice(1)
  const user = decodeURIComponent(upstream.username) || 'postgres'
  const password = 'a "quoted" secret'
  const bouncer = spawnDaemon(t, 'sh', ['deploy/pgbouncer/entrypoint.sh'], {
    PATH: `${process.env.PATH}:/usr/sbin`,
    PGBOUNCER_PASSWORD: password,
    PGBOUNCER_DATABASE: database,
    PGBOUNCER_USER: user,
    PGBOUNCER_UPSTREAM_HOST: upstream.hostname === 'localhost' ? '127.0.0.1' : upstream.hostname,
    PGBOUNCER_UPSTREAM_PORT: upstream.port || '5432',
    PGBOUNCER_LISTEN_ADDR: '127.0.0.1',
    PGBOUNCER_LISTEN_PORT: String(port),
    PGBOUNCER_DEFAULT_POOL_SIZE: '1',
    PGBOUNCER_CONFIG_DIR: join(dir, 'config')
  })
  await until(() => /listening on 127\.0\.0\.1/.test(bouncer.output()) || bouncer.child.exitCode !== null, { intervalMs: 50 }).catch(() => {})
  t.match(bouncer.output(), /listening on 127\.0\.0\.1/, bouncer.output())
  t.match(readFileSync(join(dir, 'config', 'pgbouncer.ini'), 'utf8'), /^pool_mode = transaction$/m)

  const url = `postgres://${encodeURIComponent(user)}:${encodeURIComponent(password)}@127.0.0.1:${port}/${database}`
  const wrong = new pg.Client({ connectionString: url.replace(encodeURIComponent(password), 'wrong') })
  await t.rejects(wrong.connect(), /password authentication failed|SASL|auth/i, 'a wrong password is refused')
  // Two clients at once on a pool of one server connection: in transaction mode each
  // transaction borrows it in turn (session mode would hold the second client back).
  const [a, b] = [new pg.Client({ connectionString: url }), new pg.Client({ connectionString: url })]
  await a.connect()
  t.teardown(() => a.end())
  await b.connect()
  t.teardown(() => b.end())
  const pidA = (await a.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid
  const pidB = (await b.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid
  t.equal(pidB, pidA, 'both clients ran on the one server connection')
})
