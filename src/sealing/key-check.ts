import { sql } from 'drizzle-orm'
import type { Db } from '../db/client.js'
import { queryRows } from '../db/rows.js'
import { discardGeneratedKey, SealingKeysError, type ResolvedKeys } from './key-file.js'
import { Keyring, SealBroken, type SealingKey } from './keyring.js'

/**
 * A small value sealed under each key id this database has seen (instance_settings,
 * `sealing.check.<id>`): a key configured under a known id must open it. Without it, a wrong
 * key under the right id (a typo, another installation's file) would start, seal new data
 * under a key nobody else holds and answer every old record with a broken seal.
 */
const CHECK_TEXT = 'parley sealing check v1'
const checkKey = (keyId: string) => `sealing.check.${keyId}`
const checkRecord = (keyId: string) => `instance_settings.value:${checkKey(keyId)}`

export class WrongSealingKey extends Error {
  override name = 'WrongSealingKey'
  readonly keyId: string
  constructor (keyId: string, source: string) {
    super(`${source}: key ${keyId} does not open this database's data: it is not the key this database was sealed with`)
    this.keyId = keyId
  }
}

/**
 * Checks each configured key against its check value, writing the values still missing (a new
 * key id: its first start). Throws WrongSealingKey naming the first key that does not open
 * its own. Safe from several instances at once: the first value written for an id is the one
 * every instance checks against.
 */
export async function checkSealingKeys (db: Db, keys: SealingKey[], source = 'SEALING_KEYS'): Promise<void> {
  for (const key of keys) {
    const ring = new Keyring([key])
    const sealed = ring.sealText(CHECK_TEXT, checkRecord(key.id))
    await queryRows(db, sql`
      INSERT INTO instance_settings (key, value) VALUES (${checkKey(key.id)}, to_jsonb(${sealed}::text))
      ON CONFLICT (key) DO NOTHING`)
    const [row] = await queryRows<{ value: unknown }>(db, sql`SELECT value FROM instance_settings WHERE key = ${checkKey(key.id)}`)
    let opened: string | undefined
    try {
      opened = typeof row?.value === 'string' ? ring.openText(row.value, checkRecord(key.id), key.id) : undefined
    } catch (err) {
      if (!(err instanceof SealBroken)) throw err
    }
    if (opened !== CHECK_TEXT) throw new WrongSealingKey(key.id, source)
  }
}

/**
 * checkSealingKeys for keys resolved at start: a key file made just now that does not open the
 * database means the real one was lost; it is taken back, and the refusal says so.
 */
export async function verifySealingKeys (db: Db, resolved: ResolvedKeys): Promise<void> {
  try {
    await checkSealingKeys(db, resolved.keys, resolved.source)
  } catch (err) {
    if (!(err instanceof WrongSealingKey) || resolved.generated === undefined) throw err
    discardGeneratedKey(resolved)
    throw new SealingKeysError(`${resolved.source} is missing, and this database was sealed under a key ${err.keyId} that a new key cannot stand in for: restore the file from its backup (docs/security.md)`)
  }
}
