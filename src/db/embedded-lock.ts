import { mkdirSync, openSync, readFileSync, rmSync, writeSync, closeSync } from 'node:fs'
import { join } from 'node:path'

/** Thrown when another live process holds the embedded database. */
export class DataDirectoryInUse extends Error {
  override name = 'DataDirectoryInUse'
}

interface LockOwner { pid: number, command: string, startedAt: string }

function isAlive (pid: number): boolean {
  try {
    process.kill(pid, 0)
    return true
  } catch (err) {
    // EPERM: the process exists but belongs to someone else.
    return (err as NodeJS.ErrnoException).code === 'EPERM'
  }
}

function readOwner (file: string): LockOwner | undefined {
  try {
    return JSON.parse(readFileSync(file, 'utf8')) as LockOwner
  } catch {
    return undefined
  }
}

/**
 * PGlite is one Postgres backend writing straight into the data directory: two processes on
 * one directory would corrupt it. The first process to create the lock file owns the directory
 * until it releases it or dies; a lock left by a dead process is taken over.
 */
export function lockDataDirectory (dataDir: string, command: string): () => void {
  mkdirSync(dataDir, { recursive: true })
  const file = join(dataDir, 'parley.lock')
  for (let attempt = 0; attempt < 3; attempt++) {
    let fd: number
    try {
      fd = openSync(file, 'wx', 0o600)
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err
      const owner = readOwner(file)
      if (owner !== undefined && owner.pid !== process.pid && isAlive(owner.pid)) {
        throw new DataDirectoryInUse(
          `The embedded database in ${dataDir} is in use by \`parley ${owner.command}\` (pid ${owner.pid}); ` +
          'stop that process first, or point DATABASE_URL at PostgreSQL to share one database between processes'
        )
      }
      rmSync(file, { force: true })
      continue
    }
    const owner: LockOwner = { pid: process.pid, command, startedAt: new Date().toISOString() }
    writeSync(fd, JSON.stringify(owner))
    closeSync(fd)
    return () => {
      if (readOwner(file)?.pid === process.pid) rmSync(file, { force: true })
    }
  }
  throw new DataDirectoryInUse(`Could not lock the embedded database in ${dataDir}`)
}
