import { spawn, type ChildProcess } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { Database } from '../../src/db/client.js'
import type { TestContext } from '../helper.js'
import { TEST_SEALING_KEYS } from './sealing.js'

const ROOT = join(import.meta.dirname, '..', '..')
const BIN = join(ROOT, 'bin', 'parley.js')

/**
 * Node's options in `npm start` (package.json), before `bin/parley.js serve`, for a test's or a
 * bench's server to run as the shipped one does, with its V8 heap budget (compose.test.ts checks
 * the Dockerfile's CMD matches). Only heap sizes are taken: anything else there (an env file,
 * say) would reach past childEnv, and is refused.
 */
export function serveNodeArgs (): string[] {
  const start = (JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { scripts: { start: string } }).scripts.start
  const words = start.trim().split(/\s+/)
  const options = words.slice(1, -2)
  if (words[0] !== 'node' || words.at(-2) !== 'bin/parley.js' || words.at(-1) !== 'serve' ||
    !options.every((option) => /^--max-(old|semi)-space-size=\d+$/.test(option))) {
    throw new Error(`package.json's start script is not \`node [--max-old-space-size=N] [--max-semi-space-size=N] bin/parley.js serve\`: ${start}`)
  }
  return options
}

/**
 * `env` without tap's process-info loader (`--import` of @tapjs/processinfo in NODE_OPTIONS, and
 * its `_TAPJS_PROCESSINFO_*` settings), unless coverage is being taken: it is for coverage, and
 * on Node 22 it sends every module a child loads through a worker thread, ~0.6 s of CPU a child
 * (60 % of a `parley user list`, 2026-11-29). Whatever else NODE_OPTIONS holds is kept.
 */
export function withoutTapLoader (env: NodeJS.ProcessEnv): NodeJS.ProcessEnv {
  if (env._TAPJS_PROCESSINFO_COVERAGE_ === '1') return env
  const kept: NodeJS.ProcessEnv = {}
  for (const [name, value] of Object.entries(env)) if (!name.startsWith('_TAPJS_PROCESSINFO_')) kept[name] = value
  if (env.NODE_OPTIONS !== undefined) {
    // Node's own syntax: words, or double-quoted strings with backslash escapes.
    const words = [...env.NODE_OPTIONS.matchAll(/"((?:[^"\\]|\\.)*)"|(\S+)/g)].map((m) => m[2] ?? m[1]!.replace(/\\(.)/g, '$1'))
    const options: string[] = []
    for (let i = 0; i < words.length; i++) {
      const word = words[i]!
      if (/^--(import|loader|experimental-loader)=.*@tapjs[\\/]processinfo/.test(word)) continue
      if (/^--(import|loader|experimental-loader)$/.test(word) && /@tapjs[\\/]processinfo/.test(words[i + 1] ?? '')) { i++; continue }
      options.push(word)
    }
    if (options.length > 0) kept.NODE_OPTIONS = options.map((word) => `"${word.replace(/(["\\])/g, '\\$1')}"`).join(' ')
    else delete kept.NODE_OPTIONS
  }
  return kept
}

/** The environment of a child `parley`: ours, minus database settings and tap's loader, plus the test's own. */
export function childEnv (env: Record<string, string | undefined>): NodeJS.ProcessEnv {
  // Every child seals with the tests' key unless a test gives its own (or unsets it).
  const base = withoutTapLoader({ SEALING_KEYS: TEST_SEALING_KEYS, ...process.env })
  for (const name of ['DATABASE_URL', 'DATA_DIR', 'PORT', 'HOST', 'REDIS_URL', 'LOG_LEVEL']) delete base[name]
  for (const [name, value] of Object.entries(env)) {
    if (value === undefined) delete base[name]
    else base[name] = value
  }
  return base
}

export interface CliResult { code: number | null, stdout: string, stderr: string }

/** Runs `parley …` to completion. */
export function runCli (args: string[], env: Record<string, string | undefined>): Promise<CliResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [BIN, ...args], { env: childEnv(env), stdio: ['ignore', 'pipe', 'pipe'] })
    let stdout = ''
    let stderr = ''
    child.stdout.on('data', (chunk: Buffer) => { stdout += chunk.toString() })
    child.stderr.on('data', (chunk: Buffer) => { stderr += chunk.toString() })
    child.on('error', reject)
    child.on('close', (code) => resolve({ code, stdout, stderr }))
  })
}

/** A scratch directory removed at teardown. */
export function tempDir (t: TestContext, prefix = 'parley-'): string {
  const dir = mkdtempSync(join(tmpdir(), prefix))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  return dir
}

export interface ServerProcess {
  url: string
  child: ChildProcess
  output(): string
  /** Sends SIGTERM and resolves with the exit code. */
  stop(): Promise<number | null>
}

/**
 * Starts `parley serve` as a child process on a free loopback port and resolves once it
 * listens. Stopped at teardown if the test did not stop it.
 */
export function startServer (t: TestContext, env: Record<string, string | undefined>, timeoutMs = 60_000): Promise<ServerProcess> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [...serveNodeArgs(), BIN, 'serve'], {
      env: childEnv({ HOST: '127.0.0.1', PORT: '0', LOG_LEVEL: 'info', ...env }),
      stdio: ['ignore', 'pipe', 'pipe']
    })
    let output = ''
    let exited = false
    const exit = new Promise<number | null>((resolve) => child.on('exit', (code) => { exited = true; resolve(code) }))
    const stop = async () => {
      if (!exited) child.kill('SIGTERM')
      return exit
    }
    t.teardown(async () => { await stop() })
    const timer = setTimeout(() => reject(new Error(`server did not start within ${timeoutMs} ms:\n${output}`)), timeoutMs)
    const onData = (chunk: Buffer) => {
      output += chunk.toString()
      const match = /Server listening at (http:\/\/127\.0\.0\.1:\d+)/.exec(output)
      if (match !== null) {
        clearTimeout(timer)
        resolve({ url: match[1]!, child, output: () => output, stop })
      }
    }
    child.stdout.on('data', onData)
    child.stderr.on('data', onData)
    void exit.then((code) => {
      clearTimeout(timer)
      reject(new Error(`server exited with ${code} before listening:\n${output}`))
    })
  })
}

/**
 * Runs `parley …` inside this process, as the CLI's `main` with the given environment: the
 * same code as the binary without a process start per command. Process-level behaviour (exit
 * status, signals, the data-directory lock) is tested with runCli.
 */
export async function runCliInProcess (args: string[], env: Record<string, string | undefined>, database?: Database): Promise<CliResult> {
  const { main } = await import('../../src/cli.js')
  let stdout = ''
  let stderr = ''
  const code = await main(args, {
    env: childEnv(env),
    stdout: (text) => { stdout += text },
    stderr: (text) => { stderr += text },
    // Kept open across the commands: the command gets it, and its close is the test's.
    ...(database !== undefined ? { openDatabase: async () => ({ ...database, close: async () => {} }) } : {})
  })
  return { code, stdout, stderr }
}

/**
 * The database `env` names, opened as the CLI opens it, once for many runCliInProcess calls
 * (an embedded database's start is about a second each); closed at teardown.
 */
export async function openedForCli (t: TestContext, env: Record<string, string>): Promise<Database> {
  const { openDatabase } = await import('../../src/db/client.js')
  const database = await openDatabase({ databaseUrl: env.DATABASE_URL, dataDir: env.DATA_DIR ?? '', command: 'test', poolSize: 2 })
  t.teardown(() => database.close())
  return database
}

/**
 * Settings for a child `parley` on a migrated database of its own, on the suite's backend:
 * a fresh PostgreSQL database (dropped at teardown), or an embedded data directory unpacked
 * from the snapshot.
 */
export async function childDatabaseEnv (t: TestContext): Promise<Record<string, string>> {
  const { freshDatabase, freshDataDir, usingPostgres } = await import('./databases.js')
  if (usingPostgres()) {
    const fresh = await freshDatabase()
    await fresh.database.close()
    t.teardown(() => fresh.drop())
    return { DATABASE_URL: fresh.url! }
  }
  const dir = join(tempDir(t), 'data')
  await freshDataDir(dir)
  return { DATA_DIR: dir }
}

/**
 * A helper server a test runs beside Parley (Caddy, PgBouncer): its output kept for the test's
 * messages, stopped with SIGTERM at teardown. `env` is the whole environment it gets.
 */
export function spawnDaemon (t: TestContext, command: string, args: string[], env: NodeJS.ProcessEnv): { child: ChildProcess, output(): string } {
  const child = spawn(command, args, { env, stdio: ['ignore', 'pipe', 'pipe'] })
  let output = ''
  child.stdout!.on('data', (chunk: Buffer) => { output += chunk.toString() })
  child.stderr!.on('data', (chunk: Buffer) => { output += chunk.toString() })
  const exited = new Promise((resolve) => child.on('exit', resolve))
  t.teardown(async () => {
    if (child.exitCode === null) child.kill('SIGTERM')
    await exited
  })
  return { child, output: () => output }
}
