import { execFile, spawn } from 'node:child_process'
import { TEST_SEALING_KEYS } from '../support/sealing.js'
import { cpSync, existsSync } from 'node:fs'
import { join } from 'node:path'
import { promisify } from 'node:util'
import t from 'tap'
import { usingPostgres } from '../support/databases.js'
import { childDatabaseEnv, serveNodeArgs, tempDir, withoutTapLoader } from '../support/processes.js'

const run = promisify(execFile)

// What the production image holds: the checkout after `npm run build`, installed without
// development dependencies. It takes one `npm ci` (from the local cache), so it runs once per
// CI run, in the PostgreSQL pass.
t.test('npm ci --omit=dev, then node bin/parley.js serve, works from a built tree', {
  skip: usingPostgres() ? false : 'runs once per CI run, in the PostgreSQL pass',
  timeout: 240_000
}, async (t) => {
  const tree = join(tempDir(t, 'parley-prod-'), 'parley')
  const { stdout: tracked } = await run('git', ['ls-files', '-z'], { maxBuffer: 16 * 1024 * 1024 })
  for (const file of tracked.split('\0').filter((f) => f !== '' && existsSync(f))) cpSync(file, join(tree, file))
  for (const built of ['dist', join('web', 'dist')]) cpSync(built, join(tree, built), { recursive: true })

  await run('npm', ['ci', '--omit=dev', '--prefer-offline', '--no-audit', '--no-fund'], { cwd: tree, maxBuffer: 16 * 1024 * 1024 })
  t.notOk(existsSync(join(tree, 'node_modules', 'tsx')), 'tsx is a development dependency')
  t.notOk(existsSync(join(tree, 'node_modules', 'esbuild')), 'esbuild is a development dependency')
  t.notOk(existsSync(join(tree, 'node_modules', 'tap')), 'tap is a development dependency')

  const env = { SEALING_KEYS: TEST_SEALING_KEYS, ...withoutTapLoader(process.env), ...await childDatabaseEnv(t), HOST: '127.0.0.1', PORT: '0', LOG_LEVEL: 'info' }
  const version = await run(process.execPath, ['bin/parley.js', '--version'], { cwd: tree, env })
  t.match(version.stdout, /^parley \d+\.\d+\.\d+/)

  const child = spawn(process.execPath, [...serveNodeArgs(), 'bin/parley.js', 'serve'], { cwd: tree, env, stdio: ['ignore', 'pipe', 'pipe'] })
  const exited = new Promise<number | null>((resolve) => child.on('exit', resolve))
  t.teardown(async () => {
    if (child.exitCode === null) child.kill('SIGTERM')
    await exited
  })
  let output = ''
  const url = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no listening line within 60 s:\n${output}`)), 60_000)
    const onData = (chunk: Buffer) => {
      output += chunk.toString()
      const match = /Server listening at (http:\/\/127\.0\.0\.1:\d+)/.exec(output)
      if (match !== null) {
        clearTimeout(timer)
        resolve(match[1]!)
      }
    }
    child.stdout.on('data', onData)
    child.stderr.on('data', onData)
    void exited.then((code) => reject(new Error(`exited with ${code}:\n${output}`)))
  })
  t.equal((await fetch(`${url}/readyz`)).status, 200)
  t.equal((await fetch(`${url}/`)).status, 200, 'the web console is served from the built files')
  child.kill('SIGTERM')
  t.equal(await exited, 0)
})
