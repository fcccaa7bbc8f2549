import { execFile } from 'node:child_process'
import { existsSync, readFileSync } from 'node:fs'
import { request } from 'node:https'
import { join } from 'node:path'
import { promisify } from 'node:util'
import t from 'tap'
import { childDatabaseEnv, runCliInProcess, spawnDaemon, startServer, tempDir } from '../support/processes.js'
import { freePort } from '../support/ports.js'
import { until } from '../support/until.js'

const caddy = await promisify(execFile)('caddy', ['version']).then(() => true, () => false)

interface Answer { status: number, headers: Record<string, string | string[] | undefined>, body: string }

/** An HTTPS request to Caddy that trusts only Caddy's local CA, from a given loopback address. */
function get (url: string, ca: string, headers: Record<string, string> = {}): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = request(url, { ca, headers, localAddress: '127.0.0.2', timeout: 10_000 }, (res) => {
      let body = ''
      res.on('data', (chunk: Buffer) => { body += chunk.toString() })
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body }))
    })
    req.on('error', reject)
    req.on('timeout', () => req.destroy(new Error('timed out')))
    req.end()
  })
}

t.test('behind Caddy (deploy/Caddyfile) over HTTPS on loopback, with TRUST_PROXY', {
  skip: caddy ? false : 'Caddy is not installed (Debian package caddy); .ci/run installs it'
}, async (t) => {
  const env = { ...await childDatabaseEnv(t), TRUST_PROXY: '127.0.0.1' }
  t.equal((await runCliInProcess(['user', 'create', 'alice'], env)).code, 0)
  const key = JSON.parse((await runCliInProcess(['key', 'create', 'alice', '--json'], env)).stdout) as { keyId: string, secret: string }
  const server = await startServer(t, env)

  const home = tempDir(t, 'parley-caddy-')
  const [httpPort, httpsPort] = [await freePort(), await freePort()]
  const proxy = spawnDaemon(t, 'caddy', ['run', '--config', 'deploy/Caddyfile', '--adapter', 'caddyfile'], {
    PATH: process.env.PATH,
    HOME: home,
    XDG_DATA_HOME: join(home, 'data'),
    XDG_CONFIG_HOME: join(home, 'config'),
    CADDY_HTTP_PORT: String(httpPort),
    CADDY_HTTPS_PORT: String(httpsPort),
    CADDY_ADMIN: 'off',
    PARLEY_DOMAIN: 'localhost',
    PARLEY_UPSTREAM_HOST: new URL(server.url).hostname,
    PARLEY_UPSTREAM_PORT: new URL(server.url).port
  })

  // Caddy issues the certificate from its local CA as it starts.
  const root = join(home, 'data', 'caddy', 'pki', 'authorities', 'local', 'root.crt')
  const base = `https://localhost:${httpsPort}`
  let ready: Answer | undefined
  await until(async () => {
    if (existsSync(root)) ready = await get(`${base}/healthz`, readFileSync(root, 'utf8')).catch(() => undefined)
    return ready !== undefined
  }, { intervalMs: 50 }).catch(() => {})
  t.ok(ready, ready === undefined ? `Caddy never answered over HTTPS:\n${proxy.output()}` : 'Caddy answers over HTTPS')
  if (ready === undefined) return
  const ca = readFileSync(root, 'utf8')
  t.equal(ready.status, 200)
  t.equal(ready.headers['strict-transport-security'], 'max-age=31536000')

  const authorization = `Basic ${Buffer.from(`${key.keyId}:${key.secret}`).toString('base64')}`
  const whoami = await get(`${base}/v2/whoami`, ca, { authorization, 'x-forwarded-for': '203.0.113.9' })
  t.equal(whoami.status, 200, whoami.body)
  t.match(JSON.parse(whoami.body), { user: { address: 'alice' } })

  const metrics = await get(`${base}/metrics`, ca)
  t.equal(metrics.status, 404, 'metrics are not published through the proxy')
  t.equal((await fetch(`${server.url}/metrics`)).status, 200, 'but answer on the internal address')

  // The client's own address reaches Parley through X-Forwarded-For; a forged one does not.
  await until(() => server.output().includes('"url":"/v2/whoami"'), { message: 'the request logged' })
  t.match(server.output(), /"remoteAddress":"127\.0\.0\.2"/, 'the request is logged with the client\'s address, not the proxy\'s')
  t.notMatch(server.output(), /203\.0\.113\.9/, 'a client cannot forge its address through the proxy')
})
