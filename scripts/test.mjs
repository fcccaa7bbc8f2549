// `npm test`: the suite in two runs of tap. First every file that may share the machine, two at
// a time (.taprc's jobs); then the files that must run alone (.taprc's serial list: their bounds
// are relative to a bystander measured alone), one after another. Left to tap, a serial file runs
// in its place in name order, once every file before it has ended: each of the 13 left a core
// idle while the other file ran out, on every pass. Each run ends with its own summary line
// (.ci/run adds them up); the exit code is the first failure's. Given arguments (files,
// options), one run of tap takes them as they are.
import { spawnSync } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'

const root = join(dirname(fileURLToPath(import.meta.url)), '..')
const tapBin = join(root, 'node_modules', '.bin', 'tap')

/** The `serial:` list of .taprc (YAML: its `- path` items, comments between them skipped). */
function serialFiles () {
  const lines = readFileSync(join(root, '.taprc'), 'utf8').split('\n')
  const files = []
  for (let i = lines.findIndex((line) => line.startsWith('serial:')) + 1; i > 0 && i < lines.length; i++) {
    const line = lines[i]
    if (/^\S/.test(line) && !line.startsWith('#')) break
    const item = /^\s+-\s+(\S+)/.exec(line)
    if (item !== null) files.push(item[1])
  }
  return files
}

function tap (args) {
  const run = spawnSync(tapBin, ['--disable-coverage', ...args], { cwd: root, stdio: 'inherit' })
  return run.status ?? 1
}

const args = process.argv.slice(2)
if (args.length > 0) process.exit(tap(args))
const serial = serialFiles()
if (serial.length === 0) throw new Error('.taprc lists no serial files: is its serial: list still there?')
// tap's own default exclusion stays: an --exclude replaces it.
const shared = tap(['--exclude', '**/@(fixture*(s)|dist)/**', ...serial.flatMap((file) => ['--exclude', file])])
const alone = tap(['--jobs', '1', ...serial])
process.exit(shared !== 0 ? shared : alone)
