import { closeSync, mkdirSync, openSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs'
import { connect, createServer, type Server } from 'node:net'
import { hostname } from 'node:os'
import { join, resolve as resolvePath } from 'node:path'

/** Thrown when another live process holds the embedded database. */
class DataDirectoryInUse extends Error {
  override name = 'DataDirectoryInUse'
}

interface LockOwner { pid: number, command: string, host: string, startedAt: string }

// sun_path holds 108 bytes with its terminator; leave room.
const MAX_SOCKET_PATH = 100
// A takeover of a stale lock older than this was abandoned by a process that died mid-way.
const TAKEOVER_STALE_MS = 10_000

function readOwner (file: string): LockOwner | undefined {
  try {
    return JSON.parse(readFileSync(file, 'utf8')) as LockOwner
  } catch {
    return undefined
  }
}

function inUse (dataDir: string, owner: LockOwner | undefined): DataDirectoryInUse {
  const who = owner === undefined ? 'another process' : `\`parley ${owner.command}\` (pid ${owner.pid}${owner.host === hostname() ? '' : ` on ${owner.host}`})`
  return new DataDirectoryInUse(
    `The embedded database in ${dataDir} is in use by ${who}; ` +
    'stop that process first, or point DATABASE_URL at PostgreSQL to share one database between processes'
  )
}

function listen (path: string): Promise<Server | NodeJS.ErrnoException> {
  return new Promise((resolve) => {
    // Anyone who connects is only asking whether the lock is held: hang up at once.
    const server = createServer((socket) => socket.destroy())
    server.once('error', (err) => resolve(err))
    server.listen(path, () => {
      server.removeAllListeners('error')
      // An error after listening (there is none in practice) must not crash the process.
      server.on('error', () => {})
      server.unref()
      resolve(server)
    })
  })
}

/** Whether a live process listens on the socket: the kernel closes a dead process's sockets. */
function held (path: string): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect(path)
    socket.once('connect', () => { socket.destroy(); resolve(true) })
    socket.once('error', () => resolve(false))
  })
}

/**
 * PGlite is one Postgres backend writing straight into the data directory: two processes on
 * one directory would corrupt it. The lock is a Unix socket the owner listens on in the
 * directory: the kernel releases it when the owner dies however it dies (SIGKILL, OOM), and a
 * socket on a shared volume is seen from every container on the host, whatever their pid
 * namespaces (a pid file is not: two containers both run as pid 1, and a dead pid may be
 * reused or linger as a zombie). `parley.lock` beside it names the owner for the message.
 * Resolves with the function that releases the lock.
 */
export async function lockDataDirectory (dataDir: string, command: string): Promise<() => void> {
  mkdirSync(dataDir, { recursive: true })
  const ownerFile = join(dataDir, 'parley.lock')
  const socketPath = join(resolvePath(dataDir), 'parley.lock.sock')
  if (Buffer.byteLength(socketPath) > MAX_SOCKET_PATH) {
    throw new Error(`DATA_DIR ${dataDir} is too long for the embedded database's lock socket (at most ${MAX_SOCKET_PATH - 17} bytes as an absolute path); choose a shorter path`)
  }
  const takeover = join(dataDir, 'parley.lock.takeover')
  for (let attempt = 0; attempt < 5; attempt++) {
    const result = await listen(socketPath)
    if (!(result instanceof Error)) {
      const owner: LockOwner = { pid: process.pid, command, host: hostname(), startedAt: new Date().toISOString() }
      writeFileSync(ownerFile, JSON.stringify(owner), { mode: 0o600 })
      return () => {
        result.close()
        rmSync(socketPath, { force: true })
        if (readOwner(ownerFile)?.startedAt === owner.startedAt) rmSync(ownerFile, { force: true })
      }
    }
    if (result.code !== 'EADDRINUSE') throw result
    if (await held(socketPath)) throw inUse(dataDir, readOwner(ownerFile))
    // The owner died and left its socket file. Only one process replaces it: whoever creates
    // the takeover file; the others retry and find the new owner listening.
    let fd: number | undefined
    try {
      fd = openSync(takeover, 'wx', 0o600)
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err
      const age = Date.now() - (statSafe(takeover) ?? Date.now())
      if (age > TAKEOVER_STALE_MS) rmSync(takeover, { force: true })
      await new Promise((resolve) => setTimeout(resolve, 100))
      continue
    }
    try {
      if (!await held(socketPath)) rmSync(socketPath, { force: true })
    } finally {
      closeSync(fd)
      rmSync(takeover, { force: true })
    }
  }
  throw inUse(dataDir, readOwner(ownerFile))
}

function statSafe (path: string): number | undefined {
  try {
    return statSync(path).mtimeMs
  } catch {
    return undefined
  }
}
