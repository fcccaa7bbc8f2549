import { execFile, spawn } from 'node:child_process'
import { join } from 'node:path'
import { promisify } from 'node:util'
import t from 'tap'
import { freshDataDir } from '../support/databases.js'
import { runCli, startServer, tempDir, withoutTapLoader } from '../support/processes.js'
import { until } from '../support/until.js'

const BIN = join(import.meta.dirname, '..', '..', 'bin', 'parley.js')

// Two containers on one volume: each process is pid 1 of its own pid namespace.
const unshare = await promisify(execFile)('unshare', ['-pf', '--mount-proc', 'true']).then(() => true, () => false)

async function dataDir (t: Parameters<typeof tempDir>[0]): Promise<string> {
  const dir = join(tempDir(t), 'data')
  await freshDataDir(dir)
  return dir
}

/** `parley …` as pid 1 of a new pid namespace, as in a container. */
function inNamespace (args: string[], env: Record<string, string>) {
  // Embedded, whatever the suite runs on: without DATABASE_URL (the PostgreSQL pass sets it).
  const { DATABASE_URL: _postgres, ...inherited } = withoutTapLoader(process.env)
  const child = spawn('unshare', ['-pf', '--mount-proc', '--kill-child', process.execPath, BIN, ...args], {
    env: { ...inherited, HOST: '127.0.0.1', PORT: '0', LOG_LEVEL: 'info', ...env },
    stdio: ['ignore', 'pipe', 'pipe']
  })
  let output = ''
  child.stdout.on('data', (chunk: Buffer) => { output += chunk.toString() })
  child.stderr.on('data', (chunk: Buffer) => { output += chunk.toString() })
  const exited = new Promise<number | null>((resolve) => child.on('exit', resolve))
  return { child, exited, output: () => output }
}

t.test('two processes in different pid namespaces (both pid 1) cannot share one embedded database', {
  skip: unshare ? false : 'unshare -p needs root (or user namespaces) here'
}, async (t) => {
  const DATA_DIR = await dataDir(t)
  const server = inNamespace(['serve'], { DATA_DIR })
  t.teardown(async () => {
    // unshare ignores SIGTERM while it waits; killing it takes its child along (--kill-child).
    if (server.child.exitCode === null) server.child.kill('SIGKILL')
    await server.exited
  })
  // Listening, or gone: a busy machine took over 10 s to start one (the embedded database's start).
  await until(() => /Server listening/.test(server.output()) || server.child.exitCode !== null, { timeoutMs: 60_000 }).catch(() => {})
  t.match(server.output(), /Server listening/, 'the first gets in')

  const second = inNamespace(['user', 'list'], { DATA_DIR })
  t.equal(await second.exited, 1, 'the second is refused')
  t.match(second.output(), /is in use by `parley serve` \(pid 1\)/)
})

t.test('right after the server is SIGKILLed, the embedded database opens again at once', async (t) => {
  const DATA_DIR = await dataDir(t)
  const server = await startServer(t, { DATA_DIR })
  const exited = new Promise((resolve) => server.child.once('exit', resolve))
  server.child.kill('SIGKILL')
  await exited
  const next = await runCli(['user', 'list', '--json'], { DATA_DIR })
  t.equal(next.code, 0, next.stderr)
  // The demo key is made before the server listens, so a kill after that finds it committed.
  const users = JSON.parse(next.stdout) as Array<{ address: string }>
  t.same(users.map((user) => user.address).sort(), ['demo', 'testbot'])
  // And the lock is held again while that runs: a server now starts, and a CLI call is refused.
  const again = await startServer(t, { DATA_DIR })
  const refused = await runCli(['user', 'list'], { DATA_DIR })
  t.equal(refused.code, 1)
  t.match(refused.stderr, /in use by `parley serve`/)
  t.equal(await again.stop(), 0)
  t.equal((await runCli(['user', 'list'], { DATA_DIR })).code, 0, 'a clean stop releases it')
})
