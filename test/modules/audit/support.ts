import type { LightMyRequestResponse } from 'fastify'
import { createKeysRepository } from '../../../src/modules/keys/keys.repository.js'
import { build, type Caller, type TestContext } from '../../helper.js'

/** Webhooks to loopback (no WEBHOOK_SECRETS_KEY needed), and no rate limit in the way. */
const ENV = { WEBHOOK_ALLOW_PRIVATE: 'true', RATE_LIMIT_PER_SECOND: '100000' }

export interface Entry {
  id: string
  at: string
  actor: { key: string, address: string } | 'cli'
  action: string
  target: string
  requestId: string | null
  ip: string | null
}

/** The app, an admin (root, a key with only the admin scope, made without the API: no entry) and a reader of the log. */
export async function setUp (t: TestContext) {
  const built = await build(t, { env: ENV })
  await built.createUser('root')
  const admin = built.callerFor('root', await createKeysRepository(built.db).create('root', null, { scopes: ['admin'] }))
  /** Every entry (or those `query` keeps), newest first, through the API a page at a time. */
  async function audit (query = '', limit = 200): Promise<Entry[]> {
    const entries: Entry[] = []
    let cursor: string | null = null
    do {
      const res: LightMyRequestResponse = await admin.get(`/v2/admin/audit?limit=${limit}${query === '' ? '' : `&${query}`}${cursor === null ? '' : `&cursor=${cursor}`}`)
      if (res.statusCode !== 200) throw new Error(`GET /v2/admin/audit answered ${res.statusCode}: ${res.body}`)
      entries.push(...(res.json() as { entries: Entry[] }).entries)
      cursor = res.json().nextCursor
    } while (cursor !== null)
    return entries
  }
  return { ...built, admin, audit }
}

/** What identifies an entry's origin in a test: who, what, on what, from which request. */
export function shape (entry: Entry) {
  return { actor: entry.actor, action: entry.action, target: entry.target, requestId: entry.requestId }
}

export const actorOf = (caller: Caller) => ({ key: caller.keyId, address: caller.address })
