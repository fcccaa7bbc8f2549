import { chmodSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import type { Config } from '../config.js'
import { newSealingKey, parseSealingKeys, type SealingKey } from './keyring.js'

/** The embedded database's own key, beside it in DATA_DIR: SEALING_KEYS' syntax, one line. */
const KEY_FILE_NAME = 'sealing.key'

export interface ResolvedKeys {
  keys: SealingKey[]
  /** Where they came from, for messages: 'SEALING_KEYS' or the key file's path. */
  source: string
  /** Set when this start made the key file: the one line to tell the operator. */
  generated?: string
}

/** Refusals that are the operator's to fix: printed as they are, one line. */
export class SealingKeysError extends Error {
  override name = 'SealingKeysError'
}

const keysMissingOnPostgres = 'SEALING_KEYS is not set: on PostgreSQL the service needs a key to seal content at rest; ' +
  'set SEALING_KEYS=k1:<64 hex digits> (make one with `openssl rand -hex 32`) and keep it apart from the database\'s backups (docs/security.md)'

/**
 * The sealing keys for this process (API.md §11): SEALING_KEYS when given; otherwise, for the
 * embedded database, DATA_DIR/sealing.key, made (mode 0600) on the first start; on PostgreSQL
 * none is made, since a key generated on one app host would be missing on the next one and a
 * shared database would then hold data that only one host can read.
 */
export function resolveSealingKeys (config: Pick<Config, 'sealingKeys' | 'databaseUrl' | 'dataDir'>): ResolvedKeys {
  if (config.sealingKeys !== undefined) return { keys: config.sealingKeys, source: 'SEALING_KEYS' }
  if (config.databaseUrl !== undefined) throw new SealingKeysError(keysMissingOnPostgres)
  const path = join(config.dataDir, KEY_FILE_NAME)
  const existing = readKeyFile(path)
  if (existing !== undefined) return { keys: existing, source: path }
  mkdirSync(config.dataDir, { recursive: true, mode: 0o700 })
  try {
    // 'wx': two processes starting at once on a new directory must not each write a key.
    writeFileSync(path, `${newSealingKey('k1')}\n`, { flag: 'wx', mode: 0o600 })
    // The mode above is masked by the umask; the file must not be readable by others whatever it is.
    chmodSync(path, 0o600)
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw new SealingKeysError(`the sealing key file ${path} could not be written: ${(err as Error).message}`)
  }
  return {
    keys: readKeyFile(path)!,
    source: path,
    generated: `Generated a sealing key in ${path} (mode 0600): keep a copy of it apart from the database's backups; without it the data cannot be read (docs/security.md)`
  }
}

function readKeyFile (path: string): SealingKey[] | undefined {
  let text: string
  try {
    text = readFileSync(path, 'utf8')
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined
    throw new SealingKeysError(`the sealing key file ${path} cannot be read: ${(err as Error).message}`)
  }
  try {
    return parseSealingKeys(text.trim())
  } catch (err) {
    throw new SealingKeysError(`the sealing key file ${path} is not valid: ${(err as Error).message}`)
  }
}

/**
 * Takes back a key file this process has just made, when the database turned out to be sealed
 * under another key (the file was lost): a later start then says the same thing again rather
 * than find a wrong key in place.
 */
export function discardGeneratedKey (resolved: ResolvedKeys): void {
  if (resolved.generated !== undefined) rmSync(resolved.source, { force: true })
}
