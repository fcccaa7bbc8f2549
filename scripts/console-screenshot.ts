// Makes the README's pictures of the web console (docs/console.png, docs/console-phone.png): a
// real server (`parley serve`'s startService, embedded database in a temporary directory), a
// believable conversation seeded through the API, then headless Chromium signed in as alice.
// `npm run screenshot:console`; needs Debian's chromium (or CHROMIUM_PATH).
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { sql } from 'drizzle-orm'
import { chromium, type Page } from 'playwright-core'
import { createParleyClient } from '../src/client/index.js'
import { loadConfig } from '../src/config.js'
import { createKeysRepository } from '../src/modules/keys/keys.repository.js'
import { createUsersRepository } from '../src/modules/users/users.repository.js'
import { startService } from '../src/server.js'
import { CHROMIUM_ARGS, chromiumPath } from '../test/support/chromium.js'

const docs = join(import.meta.dirname, '..', 'docs')
const executablePath = chromiumPath()
if (executablePath === undefined) throw new Error('Chromium is not installed (apt-get install chromium, or set CHROMIUM_PATH)')

const dataDir = mkdtempSync(join(tmpdir(), 'parley-screenshot-'))
const service = await startService(loadConfig({ DATA_DIR: dataDir, HOST: '127.0.0.1', PORT: '0', LOG_LEVEL: 'warn' }), { print: () => {} })
try {
  const db = service.database.db
  const users = createUsersRepository(db)
  const keys = createKeysRepository(db)
  const people = ['alice', 'bob', 'carol', 'dave'] as const
  const key: Record<string, { keyId: string, secret: string }> = {}
  for (const address of people) {
    await users.create({ address })
    key[address] = await keys.create(address)
  }
  const as = (address: typeof people[number]) => createParleyClient({ baseUrl: service.url, ...key[address]! })

  async function say (from: typeof people[number], to: string, body: string, replyTo?: string): Promise<string> {
    const { data, error } = await as(from).POST('/v2/message', { body: { recipient: to, body, ...(replyTo === undefined ? {} : { replyTo }) } })
    if (data === undefined) throw new Error(`send failed: ${JSON.stringify(error)}`)
    return data.id
  }
  async function react (who: typeof people[number], message: string, emoji: string): Promise<void> {
    const { response } = await as(who).PUT('/v2/message/{message}/reactions/{emoji}', { params: { path: { message, emoji } } })
    if (!response.ok) throw new Error(`reaction failed: ${response.status}`)
  }
  /** Moves messages `days` back in time, a few minutes apart (the API stamps them now): a conversation that began before today. */
  async function backdate (ids: string[], days: number): Promise<void> {
    for (const [i, id] of ids.entries()) {
      await db.execute(sql`UPDATE messages SET created_at = now() - make_interval(days => ${days}, mins => ${(ids.length - i) * 4}) WHERE id = ${id}`)
    }
  }

  const dave = [await say('dave', 'alice', 'Sent you the slides from Thursday, tell me what you think.')]
  await backdate(dave, 3)
  const carol = [
    await say('alice', 'carol', 'Happy birthday! 🎂 Drinks on Friday?'),
    await say('carol', 'alice', 'Thank you!! Friday is perfect, the usual place at 7?')
  ]
  await backdate(carol, 2)
  const yesterday = [
    await say('bob', 'alice', 'Are we still on for the climbing gym on Saturday?'),
    await say('alice', 'bob', 'Yes! 10 am works for me. Should I book a belay lesson for Sam?')
  ]
  await backdate(yesterday, 1)
  const booked = await say('bob', 'alice', 'Booked the 10:00 slot, and the lesson is at 10:30')
  const harness = await say('alice', 'bob', 'Perfect. I\'ll bring the spare harness.')
  const { response } = await as('alice').PATCH('/v2/message/{message}', { params: { path: { message: harness } }, body: { body: 'Perfect. I\'ll bring the spare harness and some chalk.' } })
  if (!response.ok) throw new Error(`edit failed: ${response.status}`)
  await react('alice', booked, '🎉')
  await react('bob', harness, '👍')
  await say('bob', 'alice', 'Great, my chalk bag has a hole in it 😅', harness)
  await say('bob', 'alice', 'Can you pick me up on the way? My bike has a flat.')
  // Everything but bob's newest is read: it opens under a "new messages" divider.
  const before = await as('alice').GET('/v2/conversations/{peer}/messages', { params: { path: { peer: 'bob' }, query: { limit: 2 } } })
  const upTo = before.data?.messages[1]?.id
  if (upTo === undefined) throw new Error('history answered no messages')
  await as('alice').POST('/v2/conversations/{peer}/read', { params: { path: { peer: 'bob' } }, body: { upTo } })
  await as('alice').POST('/v2/conversations/{peer}/read', { params: { path: { peer: 'carol' } }, body: { upTo: carol[1]! } })
  // A console on a new device: its feed holds none of this (and no copy stamped before the
  // backdating); the list and threads come from the conversations and history routes.
  await as('alice').DELETE('/v2/events')

  const browser = await chromium.launch({ executablePath, headless: true, args: CHROMIUM_ARGS })
  try {
    const shoot = async (viewport: { width: number, height: number }, file: string, arrange: (page: Page) => Promise<void>) => {
      const page = await browser.newPage({ viewport, deviceScaleFactor: 1 })
      await page.goto(`${service.url}/`)
      await page.locator('[data-testid="key-id"]').fill(key.alice!.keyId)
      await page.locator('[data-testid="secret"]').fill(key.alice!.secret)
      await page.locator('[data-testid="sign-in"]').click()
      await page.locator('#connection').filter({ hasText: /^live/ }).waitFor()
      await arrange(page)
      await page.mouse.move(0, 0)
      await page.screenshot({ path: join(docs, file) })
      await page.close()
    }
    const openBob = async (page: Page) => {
      await page.locator('[data-testid="conversation"]').filter({ hasText: 'bob' }).click()
      await page.locator('[data-testid="new-messages"]').waitFor()
      await page.locator('[data-testid="quote"]').filter({ hasText: 'spare harness' }).waitFor()
    }
    await shoot({ width: 1100, height: 900 }, 'console.png', async (page) => {
      await openBob(page)
      await page.locator('[data-testid="body"]').fill('Sure, I\'ll be at yours at 9:30')
    })
    // The desktop picture read bob's newest: a newer one for the phone's divider.
    await say('bob', 'alice', 'Also, could you bring your camera? 📷')
    await shoot({ width: 375, height: 740 }, 'console-phone.png', openBob)
  } finally {
    await browser.close()
  }
} finally {
  await service.close()
  rmSync(dataDir, { recursive: true, force: true })
}
console.log(`wrote ${join(docs, 'console.png')} and console-phone.png`)
