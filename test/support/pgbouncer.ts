import { execFileSync, spawn, type ChildProcess } from 'node:child_process'
import { chmodSync, existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { freePort } from './ports.js'

/** Where Debian's package puts the binary (`apt-get install pgbouncer`), or one on PATH. */
export function pgbouncerBin (): string | undefined {
  for (const candidate of ['/usr/sbin/pgbouncer', '/usr/bin/pgbouncer']) if (existsSync(candidate)) return candidate
  try {
    const found = execFileSync('sh', ['-c', 'command -v pgbouncer'], { encoding: 'utf8' }).trim()
    return found === '' ? undefined : found
  } catch {
    return undefined
  }
}

export interface Pgbouncer {
  /** `upstream` with its host and port replaced by the pooler's. */
  url: string
  /** Everything PgBouncer logged so far. */
  output(): string
  stop(): Promise<void>
}

export interface PgbouncerOptions {
  /** Server connections per user and database (PgBouncer's default_pool_size). */
  poolSize?: number
  poolMode?: 'transaction' | 'session'
}

/**
 * A PgBouncer of its own in front of the PostgreSQL that `upstream` names (a config in a
 * temporary directory, a free loopback port, no Unix socket), forwarding any database name
 * to that server with trust authentication, as a managed PostgreSQL's pooler does in
 * transaction mode. PgBouncer refuses to run as root, so as root it drops to the postgres
 * user (`-u`). Resolves once it accepts connections.
 */
export async function startPgbouncer (upstream: string, options: PgbouncerOptions = {}): Promise<Pgbouncer> {
  const bin = pgbouncerBin()
  if (bin === undefined) throw new Error('pgbouncer is not installed')
  const target = new URL(upstream)
  const user = decodeURIComponent(target.username) || 'postgres'
  const dir = mkdtempSync(join(tmpdir(), 'parley-pgbouncer-'))
  chmodSync(dir, 0o755)
  const port = await freePort()
  const host = target.hostname === 'localhost' ? '127.0.0.1' : target.hostname
  const config = join(dir, 'pgbouncer.ini')
  writeFileSync(join(dir, 'users.txt'), `"${user}" ""\n`, { mode: 0o644 })
  writeFileSync(config, [
    '[databases]',
    `* = host=${host} port=${target.port || '5432'}`,
    '[pgbouncer]',
    'listen_addr = 127.0.0.1',
    `listen_port = ${port}`,
    'unix_socket_dir =',
    'auth_type = trust',
    `auth_file = ${join(dir, 'users.txt')}`,
    `pool_mode = ${options.poolMode ?? 'transaction'}`,
    'max_client_conn = 2000',
    `default_pool_size = ${options.poolSize ?? 10}`,
    'reserve_pool_size = 0',
    // What a managed pooler in transaction mode keeps: no reset between clients.
    'server_reset_query =',
    'logfile =',
    'pidfile =',
    'log_connections = 0',
    'log_disconnections = 0',
    ''
  ].join('\n'), { mode: 0o644 })
  const args = process.getuid?.() === 0 ? ['-u', 'postgres', config] : [config]
  const child: ChildProcess = spawn(bin, args, { stdio: ['ignore', 'pipe', 'pipe'] })
  let output = ''
  child.stdout!.on('data', (chunk: Buffer) => { output += chunk.toString() })
  child.stderr!.on('data', (chunk: Buffer) => { output += chunk.toString() })
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()))
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM')
    await exited
    rmSync(dir, { recursive: true, force: true })
  }
  const deadline = Date.now() + 10_000
  while (!/listening on 127\.0\.0\.1/.test(output)) {
    if (child.exitCode !== null || Date.now() > deadline) {
      await stop()
      throw new Error(`pgbouncer did not start:\n${output}`)
    }
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
  const url = new URL(upstream)
  url.hostname = '127.0.0.1'
  url.port = String(port)
  return { url: url.toString(), output: () => output, stop }
}
