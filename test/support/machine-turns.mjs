// When two runs of the suite share a machine (.ci/run runs the embedded and the PostgreSQL pass
// at once), the files .taprc lists under `serial` must still have the machine to themselves:
// their bystanders are measured alone and then beside one key's abuse, and a neighbour that
// starts half-way through turns those into two different machines. tap keeps a run's own files
// apart; this keeps the two runs apart. Loaded with `--import` into every test process (.taprc
// node-arg); it does nothing unless PARLEY_TEST_TURNS names a folder both runs share.
//
// A readers-writer lock on files in that folder, held by a `flock` child for as long as this
// process lives (its stdin is our pipe: when we exit, however, it ends): a serial file takes the
// machine exclusively, any other file shares it. A file waiting to take it exclusively holds
// the turnstile, so no newcomer slips in ahead of it. .ci/run holds the shared side around its
// own heavy steps (npm ci, the checks).
//
// And the serial files wait for every run's other files: each run (PARLEY_TEST_PASS, named by
// .ci/run with a file `pass-<name>` in the folder) says it is done with them (`done-<name>`)
// when its first serial file starts (they sort last) or when it ends. Without that wait, each
// serial file would drain the other run's files and let them back in after it, once per file.
// The wait is bounded (WAIT_MS), as tap's per-file timeout counts it.
import { spawn } from 'node:child_process'
import { existsSync, readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs'
import { join, resolve, sep } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'

/** The files and folders under `serial:` in .taprc, absolute. */
function serialPaths (rcFile) {
  const files = []
  let inList = false
  for (const line of readFileSync(rcFile, 'utf8').split('\n')) {
    if (/^serial:\s*$/.test(line)) { inList = true; continue }
    if (!inList || /^\s*(#.*)?$/.test(line)) continue
    const item = /^\s+-\s+(\S+)\s*$/.exec(line)
    if (item === null) break
    files.push(resolve(item[1]))
  }
  return files
}

/** How long a run's serial files wait, together, for the other run's other files. */
const WAIT_MS = 150_000
const SHARE = 'flock -x 8 && flock -s 9 && flock -u 8 && exec 8>&-'
const TAKE = 'flock -x 8 && flock -x 9'

const folder = process.env.PARLEY_TEST_TURNS
const file = process.argv[1]
if (folder !== undefined && folder !== '' && file !== undefined) {
  const alone = serialPaths(join(process.cwd(), '.taprc')).some((path) => `${resolve(file)}${sep}`.startsWith(`${path}${sep}`))
  const pass = process.env.PARLEY_TEST_PASS
  if (alone && pass !== undefined && pass !== '') {
    const done = join(folder, `done-${pass}`)
    if (!existsSync(done)) writeFileSync(done, '')
    // At most WAIT_MS from this run's first serial file on: tap's timeout (.taprc) counts the wait.
    const until = statSync(done).mtimeMs + WAIT_MS
    const waitingOn = () => readdirSync(folder).filter((name) => name.startsWith('pass-') && !existsSync(join(folder, `done-${name.slice(5)}`)))
    while (waitingOn().length > 0 && Date.now() < until) await sleep(250)
  }
  const script = `exec 8>>"$1/turnstile" 9>>"$1/machine" && ${alone ? TAKE : SHARE} && echo held && exec cat >/dev/null`
  const holder = spawn('bash', ['-c', script, 'turns', folder], { stdio: ['pipe', 'pipe', 'inherit'] })
  await new Promise((resolve, reject) => {
    holder.once('error', reject)
    holder.once('exit', (code) => reject(new Error(`the machine's turn was not taken (flock exited ${code})`)))
    holder.stdout.once('data', () => resolve(undefined))
  })
  holder.removeAllListeners('exit')
  holder.stdout.destroy()
  // Held until this process ends; nothing here keeps it alive.
  holder.stdin.unref()
  holder.unref()
}
