import type { Db } from '../../db/client.js'
import { createSettingsRepository } from '../../db/settings.repository.js'
import { transaction } from '../../db/transaction.js'
import { createUsersRepository } from '../users/users.repository.js'
import { createKeysRepository, type CreatedKey } from './keys.repository.js'

const DEMO_ADDRESS = 'demo'

/**
 * On the first start of an embedded database, make a user `demo` with one key so a developer
 * can try the service at once. Recorded in instance_settings, so it happens at most once per
 * database, and not at all where an operator already made keys.
 */
export async function seedDemoKey (db: Db): Promise<CreatedKey | undefined> {
  return transaction(db, async (tx) => {
    if (!await createSettingsRepository(tx).claimOnce('demo_key_issued')) return undefined
    const keys = createKeysRepository(tx)
    if (await keys.count() > 0) return undefined
    await createUsersRepository(tx).ensure({ address: DEMO_ADDRESS, displayName: 'Demo' })
    return keys.create(DEMO_ADDRESS)
  })
}

/** What `npm start` prints once: the key, and a request that sends the bot a message. */
export function demoBanner (key: CreatedKey, baseUrl: string, botAddress: string): string {
  const body = JSON.stringify({ recipient: botAddress, body: 'Hello, Parley!' })
  return [
    '',
    'First start of this embedded database: created user "demo" with an API key.',
    'The secret is shown only this once; keep it somewhere safe.',
    '',
    `  key id:  ${key.keyId}`,
    `  secret:  ${key.secret}`,
    '',
    `Send the test bot a message (its reply arrives in GET ${baseUrl}/v2/events):`,
    '',
    `  curl -u ${key.keyId}:${key.secret} -H 'Content-Type: application/json' -d '${body}' ${baseUrl}/v2/message`,
    ''
  ].join('\n')
}
