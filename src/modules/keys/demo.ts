import { sql } from 'drizzle-orm'
import type { Db } from '../../db/client.js'
import { instanceSettings } from '../../db/settings.table.js'
import { users } from '../users/users.table.js'
import { createKeysRepository, type CreatedKey } from './keys.repository.js'

const DEMO_ADDRESS = 'demo'

/**
 * On the first start of an embedded database, make a user `demo` with one key so a developer
 * can try the service at once. Recorded in instance_settings, so it happens at most once per
 * database, and not at all where an operator already made keys.
 */
export async function seedDemoKey (db: Db): Promise<CreatedKey | undefined> {
  return db.transaction(async (tx) => {
    const claimed = await tx.insert(instanceSettings)
      .values({ key: 'demo_key_issued', value: sql`'true'::jsonb` })
      .onConflictDoNothing()
      .returning({ key: instanceSettings.key })
    if (claimed.length === 0) return undefined
    const keys = createKeysRepository(tx)
    if (await keys.count() > 0) return undefined
    await tx.insert(users).values({ address: DEMO_ADDRESS, displayName: 'Demo' }).onConflictDoNothing()
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
