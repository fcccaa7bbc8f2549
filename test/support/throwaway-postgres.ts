import { execFile } from 'node:child_process'
import { chownSync, existsSync, mkdtempSync, readdirSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { promisify } from 'node:util'
import type { TestContext } from '../helper.js'
import { freePort } from './ports.js'

const run = promisify(execFile)

/** The server binaries of the machine's PostgreSQL, if any (Debian keeps them per version). */
export function postgresBin (): string | undefined {
  const root = '/usr/lib/postgresql'
  if (!existsSync(root)) return undefined
  const version = readdirSync(root).sort().at(-1)
  const bin = version === undefined ? undefined : join(root, version, 'bin')
  return bin !== undefined && existsSync(join(bin, 'initdb')) ? bin : undefined
}

export interface ThrowawayPostgres {
  url: string
  stop(): Promise<void>
  start(): Promise<void>
}

/**
 * A PostgreSQL cluster of the test's own (initdb on a free loopback port), so a test may stop
 * and start it without touching the machine's shared server. initdb refuses root, so as root
 * it runs as the postgres user. Removed at teardown.
 */
export async function throwawayPostgres (t: TestContext, bin: string): Promise<ThrowawayPostgres> {
  const dir = mkdtempSync(join(tmpdir(), 'parley-pg-'))
  const asRoot = process.getuid?.() === 0
  if (asRoot) {
    const { stdout } = await run('id', ['-u', 'postgres'])
    const { stdout: gid } = await run('id', ['-g', 'postgres'])
    chownSync(dir, Number(stdout.trim()), Number(gid.trim()))
  }
  const pg = (tool: string, args: string[]) => asRoot
    ? run('runuser', ['-u', 'postgres', '--', join(bin, tool), ...args])
    : run(join(bin, tool), args)
  const port = await freePort()
  const data = join(dir, 'data')
  await pg('initdb', ['-D', data, '-A', 'trust', '-U', 'postgres', '--no-sync'])
  const options = `-p ${port} -k ${dir} -c listen_addresses=127.0.0.1 -c fsync=off`
  const start = async () => { await pg('pg_ctl', ['-D', data, '-o', options, '-l', join(dir, 'log'), '-w', 'start']) }
  const stop = async () => { await pg('pg_ctl', ['-D', data, '-m', 'immediate', '-w', 'stop']) }
  await start()
  t.teardown(async () => {
    await stop().catch(() => {})
    rmSync(dir, { recursive: true, force: true })
  })
  await pg('createdb', ['-h', '127.0.0.1', '-p', String(port), '-U', 'postgres', 'parley'])
  return { url: `postgres://postgres@127.0.0.1:${port}/parley`, start, stop }
}
