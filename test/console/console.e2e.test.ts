import { sql } from 'drizzle-orm'
import { chromium, type Browser, type Page } from 'playwright-core'
import t from 'tap'
import { build, type Caller } from '../helper.js'
import { CHROMIUM_ARGS, chromiumPath } from '../support/chromium.js'
import { makePng } from '../support/png.js'
import { until } from '../support/until.js'

const executablePath = chromiumPath()
const skip = executablePath === undefined
  ? 'Chromium is not installed (apt-get install chromium): the web console\'s browser test is skipped'
  : false
if (skip !== false) t.comment(`NOTE: ${skip}`)

const byTestId = (page: Page, id: string) => page.locator(`[data-testid="${id}"]`)
/** The rendered message whose body is exactly `text` (or matches it, for a RegExp). */
const messageIn = (page: Page, text: string | RegExp) =>
  byTestId(page, 'message').filter({ has: page.locator('.body').getByText(text, { exact: true }) })

async function signIn (page: Page, caller: Caller): Promise<void> {
  await byTestId(page, 'key-id').fill(caller.keyId)
  await byTestId(page, 'secret').fill(caller.secret)
  await byTestId(page, 'sign-in').click()
}

/**
 * The web console in headless Chromium against a real listening server: sign-in, a reply from
 * the test bot without a reload, a message from someone else arriving live, text that looks like
 * HTML staying text, typing, ticks, attachments, sign-out, and no script errors throughout.
 */
t.test('the web console in a real browser', { skip }, async (t) => {
  const { app, as } = await build(t, { env: { RATE_LIMIT_PER_SECOND: '1000' } })
  const alice = await as('alice')
  const bob = await as('bob')
  await app.listen({ host: '127.0.0.1', port: 0 })
  const { port } = app.server.address() as { port: number }
  const url = `http://127.0.0.1:${port}/`

  const browser = await chromium.launch({ executablePath: executablePath!, headless: true, args: CHROMIUM_ARGS })
  t.teardown(() => browser.close())
  const page: Page = await browser.newPage({ viewport: { width: 1100, height: 720 } })
  page.setDefaultTimeout(10_000)
  const scriptErrors: string[] = []
  page.on('pageerror', (err) => scriptErrors.push(err.message))
  page.on('console', (message) => {
    // A refused fetch (the wrong secret's 401) is logged by the browser, not by a script.
    if (message.type() === 'error' && !message.text().startsWith('Failed to load resource')) scriptErrors.push(message.text())
  })
  const requested: string[] = []
  page.on('request', (request) => { requested.push(new URL(request.url()).pathname) })
  const dialogs: string[] = []
  page.on('dialog', (dialog) => { dialogs.push(dialog.message()); void dialog.dismiss() })
  const byTestId = (id: string) => page.locator(`[data-testid="${id}"]`)
  const message = (text: string | RegExp) => messageIn(page, text)

  await page.goto(url)
  const served = await page.request.get(url)
  t.match(served.headers()['content-security-policy'], /script-src 'self'/, 'the page is served with a strict CSP')
  t.notMatch(served.headers()['content-security-policy'], /unsafe-(inline|eval)/)
  const icon = await page.request.get(new URL(await page.locator('link[rel="icon"]').getAttribute('href') ?? '/missing', url).toString())
  t.equal(icon.status(), 200, 'the favicon the page names is served')
  t.match(icon.headers()['content-type'], /^image\/svg\+xml/)
  t.match(served.headers()['content-security-policy'], /img-src 'self'/, 'and the CSP lets the page load it')

  await t.test('a wrong secret keeps you out', async (t) => {
    await byTestId('key-id').fill(alice.keyId)
    await byTestId('secret').fill('not-the-secret')
    await byTestId('sign-in').click()
    await page.locator('#sign-in-error').filter({ hasText: 'Wrong key id or secret' }).waitFor()
    t.notOk(await byTestId('signed-in-as').isVisible(), 'not signed in')
    t.equal(await page.evaluate(() => sessionStorage.length), 0, 'nothing stored')
  })

  await t.test('signing in shows who you are', async (t) => {
    await signIn(page, alice)
    await byTestId('signed-in-as').filter({ hasText: 'alice' }).waitFor()
    t.equal(await byTestId('signed-in-as').textContent(), 'alice')
    t.notMatch(page.url(), /secret|key/i, 'no credentials in the URL')
    t.equal(await page.evaluate(() => localStorage.length), 0, 'nothing in localStorage')
  })

  await t.test('a message to the test bot gets its echo without a reload, and turns read', async (t) => {
    await byTestId('recipient').fill('testbot')
    await byTestId('body').fill('hello bot')
    await byTestId('send').click()
    await message('hello bot').waitFor()
    await message('echo: hello bot').waitFor({ timeout: 10_000 })
    await message('hello bot').and(page.locator('[data-status="read"]')).waitFor({ timeout: 10_000 })
    t.ok(await byTestId('conversation').filter({ hasText: 'testbot' }).isVisible(), 'testbot is in the conversation list')
  })

  await t.test('a message sent by someone else through the API appears in the open page', async (t) => {
    const sent = await bob.post('/v2/message', { recipient: 'alice', body: 'hi from bob' })
    t.equal(sent.statusCode, 200)
    await byTestId('conversation').filter({ hasText: 'bob' }).click()
    await message('hi from bob').waitFor()
    // Shown, so reported read.
    const id = (sent.json() as { id: string }).id
    await t.resolves(until(async () => (await bob.get(`/v2/message/${id}/status`)).json().recipients[0].status === 'read', { timeoutMs: 5_000, intervalMs: 50 }), 'bob sees it read')
    t.ok(requested.includes('/v2/events/stream'), 'the page follows the feed over the event stream (SSE)')
    t.equal(await page.locator('#connection').textContent(), 'live')
  })

  await t.test('a body that looks like HTML is shown as text and runs nothing', async (t) => {
    const hostile = '<img src=x onerror="window.__pwned=1;alert(1)"><script>window.__pwned=2</script>'
    t.equal((await bob.post('/v2/message', { recipient: 'alice', body: hostile })).statusCode, 200)
    await message(/^<img src=x/).waitFor()
    t.equal(await message(/^<img src=x/).locator('.body').textContent(), hostile, 'the exact text')
    t.equal(await page.locator('[data-testid="message"] img[src="x"], [data-testid="message"] script').count(), 0, 'no element made from it')
    t.equal(await page.evaluate(() => (window as unknown as { __pwned?: number }).__pwned), undefined, 'nothing ran')
    t.same(dialogs, [], 'no alert')
  })

  await t.test('typing shows, then lapses when it stops', async (t) => {
    t.equal((await bob.post('/v2/message/typing', { recipient: 'alice' })).statusCode, 204)
    await page.locator('#typing').filter({ hasText: 'bob is typing…' }).waitFor()
    t.equal((await bob.delete('/v2/message/typing/alice')).statusCode, 204)
    await page.locator('#typing').filter({ hasText: /^$/ }).waitFor()
    t.pass('typing shown and cleared')
  })

  await t.test('attachments: an image as a thumbnail, a file as a download link', async (t) => {
    await byTestId('recipient').fill('bob')
    await byTestId('body').fill('two files')
    await byTestId('attachment').setInputFiles([
      { name: 'dot.png', mimeType: 'image/png', buffer: makePng(64, 48) },
      { name: 'notes.txt', mimeType: 'text/plain', buffer: Buffer.from('some notes') }
    ])
    await byTestId('send').click()
    const sent = message('two files')
    await sent.waitFor()
    await sent.locator('img[src^="blob:"]').waitFor()
    t.equal(await sent.locator('img').getAttribute('alt'), 'dot.png')
    t.match(await sent.locator('[data-testid="file"]').textContent(), /notes\.txt/)
    const received = await bob.get('/v2/events?limit=1000')
    t.ok(received.json().events.some((e: { data: { message?: { body: string, attachments: unknown[] } } }) =>
      e.data.message?.body === 'two files' && e.data.message.attachments.length === 2), 'bob received both files')
  })

  await t.test('signing out clears the stored secret', async (t) => {
    await byTestId('sign-out').click()
    await byTestId('sign-in').waitFor()
    t.equal(await page.evaluate(() => sessionStorage.length), 0)
    await page.reload()
    await byTestId('sign-in').waitFor()
    t.notOk(await byTestId('signed-in-as').isVisible(), 'a reload does not sign back in')
  })

  await t.test('signed in after the key acknowledged its whole feed: every conversation, its history and true unread counts', async (t) => {
    // 60 from carol (more than a page), then alice's key drops everything from its feed.
    const carol = await as('carol')
    for (let i = 0; i < 60; i++) t.equal((await carol.post('/v2/message', { recipient: 'alice', body: `carol ${i}` })).statusCode, 200)
    t.equal((await alice.delete('/v2/events')).statusCode, 204)
    t.same((await alice.get('/v2/events')).json().events, [], 'the feed is empty for this key')

    const fresh = await browser.newContext({ viewport: { width: 1100, height: 720 } })
    t.teardown(() => fresh.close())
    const other = await fresh.newPage()
    other.on('pageerror', (err) => scriptErrors.push(err.message))
    await other.goto(url)
    await signIn(other, alice)
    const conversation = (name: string) => other.locator('[data-testid="conversation"]').filter({ hasText: name })
    await conversation('carol').locator('.unread').filter({ hasText: '60' }).waitFor()
    t.pass('carol\'s 60 unread, counted by the server')
    t.ok(await conversation('bob').isVisible(), 'bob\'s conversation is there too, though the feed held none of it')
    t.ok(await conversation('testbot').isVisible())

    await conversation('carol').click()
    const shown = other.locator('[data-testid="message"] .body')
    // The list's last message shows at once; the page of history (carol 10 to 59) then fills in.
    await shown.getByText('carol 10', { exact: true }).waitFor()
    t.equal(await shown.count(), 50, 'the newest page')
    // Scrolled to the top: the page before it.
    await other.locator('#messages').evaluate((list) => { list.scrollTop = 0; list.dispatchEvent(new Event('scroll')) })
    await shown.getByText('carol 0', { exact: true }).waitFor()
    t.equal(await shown.count(), 60, 'and the page before it, on scrolling up')
    // Shown, so read: one call up to the newest.
    await t.resolves(until(async () => {
      const list = (await alice.get('/v2/conversations')).json().conversations as { peer: string, unread: number }[]
      return list.find((c) => c.peer === 'carol')?.unread === 0
    }, { timeoutMs: 5_000, intervalMs: 50 }), 'the server counts none of them unread')
    await conversation('carol').locator('.unread').waitFor({ state: 'detached' })
    await other.close()
  })

  await t.test('where no event stream is offered, the page long-polls instead', async (t) => {
    const polling = await browser.newPage()
    await polling.route('**/v2/events/stream**', (route) => route.fulfill({ status: 404, contentType: 'application/json', body: '{"statusCode":404}' }))
    await polling.goto(url)
    await signIn(polling, alice)
    await polling.locator('#connection').filter({ hasText: 'live (polling)' }).waitFor()
    t.equal((await bob.post('/v2/message', { recipient: 'alice', body: 'heard by polling' })).statusCode, 200)
    await polling.locator('[data-testid="conversation"]').filter({ hasText: 'bob' }).click()
    await polling.locator('[data-testid="message"] .body').getByText('heard by polling', { exact: true }).waitFor()
    t.pass('a message arrived by long-poll')
    await polling.close()
  })

  t.same(scriptErrors, [], 'the page logged no script errors')
})

const WIDTHS = [
  { name: 'desktop', viewport: { width: 1100, height: 720 } },
  { name: 'phone', viewport: { width: 375, height: 740 } }
] as const

/**
 * A conversation's life in the console, at each width: history with older pages and day
 * separators, where the unread ones begin, read marks as one call, an edit, a reply and a
 * reaction each seen by the other side live, and on a phone the list and the thread taking turns
 * with the composer on screen and nothing wider than the screen.
 */
for (const { name, viewport } of WIDTHS) {
  t.test(`a conversation's history, edits, replies, reactions and read marks (${name}, ${viewport.width}×${viewport.height})`, { skip }, async (t) => {
    const { app, as, db } = await build(t, { env: { RATE_LIMIT_PER_SECOND: '1000' } })
    const alice = await as('alice')
    const bob = await as('bob')
    await app.listen({ host: '127.0.0.1', port: 0 })
    const { port } = app.server.address() as { port: number }
    const url = `http://127.0.0.1:${port}/`
    const phone = viewport.width < 700

    // 55 from bob, the first 5 of them yesterday (the API stamps them now; the test moves them
    // back a day); alice has read up to bob 49. A new device: her key's feed holds none of it.
    const ids: string[] = []
    for (let i = 0; i < 55; i++) {
      const sent = await bob.post('/v2/message', { recipient: 'alice', body: `bob ${i}` })
      t.equal(sent.statusCode, 200)
      ids.push((sent.json() as { id: string }).id)
    }
    for (const id of ids.slice(0, 5)) await db.execute(sql`UPDATE messages SET created_at = created_at - interval '1 day' WHERE id = ${id}`)
    t.equal((await alice.post('/v2/conversations/bob/read', { upTo: ids[49] })).statusCode, 204)
    t.equal((await alice.delete('/v2/events')).statusCode, 204)
    const unread = async (peer: string) =>
      ((await alice.get('/v2/conversations')).json().conversations as { peer: string, unread: number }[]).find((c) => c.peer === peer)?.unread

    const browser: Browser = await chromium.launch({ executablePath: executablePath!, headless: true, args: CHROMIUM_ARGS })
    t.teardown(() => browser.close())
    const scriptErrors: string[] = []
    const open = async (who: Caller) => {
      const context = await browser.newContext({ viewport })
      const page = await context.newPage()
      page.setDefaultTimeout(10_000)
      page.on('pageerror', (err) => scriptErrors.push(err.message))
      await page.goto(url)
      await signIn(page, who)
      await page.locator('#connection').filter({ hasText: /^live/ }).waitFor()
      return page
    }
    const page = await open(alice)
    const reads: string[] = []
    page.on('request', (request) => { if (request.method() === 'POST' && request.url().endsWith('/read')) reads.push(request.url()) })
    const fitsWidth = async (p: Page) => p.evaluate(() => document.scrollingElement!.scrollWidth <= window.innerWidth)
    const shown = (p: Page) => p.locator('[data-testid="message"] .body')
    const conversation = (p: Page, peer: string) => byTestId(p, 'conversation').filter({ hasText: peer })

    await t.test('the list shows the server\'s unread count; opening it shows the newest page', async (t) => {
      await conversation(page, 'bob').locator('.unread').filter({ hasText: '5' }).waitFor()
      t.ok(await fitsWidth(page), 'no horizontal scroll on the list')
      if (phone) t.notOk(await byTestId(page, 'send').isVisible(), 'on a phone the list is shown alone')
      await conversation(page, 'bob').click()
      await shown(page).getByText('bob 5', { exact: true }).waitFor()
      await messageIn(page, 'bob 54').waitFor()
      t.equal(await shown(page).count(), 50, 'the newest page of history')
      if (phone) {
        t.notOk(await byTestId(page, 'conversation').first().isVisible(), 'on a phone the thread replaces the list')
        t.ok(await byTestId(page, 'back').isVisible(), 'with a way back')
      }
      const send = await byTestId(page, 'send').boundingBox()
      t.ok(send !== null && send.y >= 0 && send.y + send.height <= viewport.height && send.x + send.width <= viewport.width, 'Send is inside the viewport')
      t.ok(await fitsWidth(page), 'no horizontal scroll in the thread')
    })

    await t.test('a "new messages" divider above the first unread, and what is shown is read with one call', async (t) => {
      const divider = byTestId(page, 'new-messages')
      await divider.waitFor()
      t.equal(await divider.evaluate((d) => d.nextElementSibling?.querySelector('.body')?.textContent), 'bob 50', 'right above bob 50')
      t.equal(await byTestId(page, 'new-messages').count(), 1)
      await t.resolves(until(async () => await unread('bob') === 0, { timeoutMs: 5_000, intervalMs: 50 }), 'the server counts none unread')
      t.equal(reads.length, 1, 'one read call for the 5 shown')
      await conversation(page, 'bob').locator('.unread').waitFor({ state: 'detached' })
    })

    await t.test('older history on scrolling up, under a day separator; times carry their date', async (t) => {
      await page.locator('#messages').evaluate((list) => { list.scrollTop = 0; list.dispatchEvent(new Event('scroll')) })
      await messageIn(page, 'bob 0').waitFor()
      t.equal(await shown(page).count(), 55, 'the page before it, on scrolling up')
      const separators = await byTestId(page, 'day-separator').allTextContents()
      t.same(separators, ['Yesterday', 'Today'], 'a separator for each day')
      t.equal(await messageIn(page, 'bob 0').evaluate((m) => m.previousElementSibling?.textContent), 'Yesterday', 'above the first message of the day')
      t.equal(await messageIn(page, 'bob 5').evaluate((m) => m.previousElementSibling?.textContent), 'Today')
      const time = messageIn(page, 'bob 0').locator('time')
      t.equal(await time.getAttribute('datetime'), (await alice.get(`/v2/message/${ids[0]}`)).json().createdAt, 'the time is the message\'s')
      t.match(await time.getAttribute('title'), String(new Date(Date.now() - 86_400_000).getFullYear()), 'its tooltip has the date')
      t.equal(reads.length, 1, 'older messages need no read call')
    })

    const other = await open(bob)
    await conversation(other, 'alice').click()
    await messageIn(other, 'bob 54').waitFor()

    await t.test('editing one\'s message: shown edited on both sides', async (t) => {
      await byTestId(page, 'body').fill('see you at 10')
      await byTestId(page, 'send').click()
      await messageIn(page, 'see you at 10').waitFor()
      await messageIn(other, 'see you at 10').waitFor()
      await messageIn(page, 'see you at 10').getByRole('button', { name: 'Edit' }).click()
      await byTestId(page, 'composing').filter({ hasText: /^Editing: see you at 10$/ }).waitFor()
      t.equal(await byTestId(page, 'body').inputValue(), 'see you at 10', 'the composer holds the text')
      t.equal(await byTestId(page, 'send').textContent(), 'Save')
      await byTestId(page, 'body').fill('see you at 11')
      await byTestId(page, 'send').click()
      await messageIn(page, 'see you at 11').locator('[data-testid="edited"]').waitFor()
      t.equal(await messageIn(page, 'see you at 10').count(), 0, 'the old text is gone')
      t.notOk(await byTestId(page, 'composing').isVisible(), 'the composer is back to new messages')
      await messageIn(other, 'see you at 11').locator('[data-testid="edited"]').waitFor()
      t.equal(await messageIn(other, 'see you at 10').count(), 0, 'the other side sees the new text, marked edited, live')
    })

    await t.test('a reply quotes what it answers on both sides; a reply can be called off', async (t) => {
      await messageIn(page, 'bob 54').getByRole('button', { name: 'Reply' }).click()
      await byTestId(page, 'composing').filter({ hasText: 'Replying to bob: bob 54' }).waitFor()
      await byTestId(page, 'cancel-composing').click()
      await byTestId(page, 'composing').waitFor({ state: 'hidden' })

      await messageIn(other, 'see you at 11').getByRole('button', { name: 'Reply' }).click()
      await byTestId(other, 'composing').filter({ hasText: 'Replying to alice: see you at 11' }).waitFor()
      await byTestId(other, 'body').fill('ok, 11 it is')
      await byTestId(other, 'send').click()
      for (const p of [other, page]) {
        await messageIn(p, 'ok, 11 it is').locator('[data-testid="quote"]').filter({ hasText: 'see you at 11' }).waitFor()
      }
      t.pass('the quote shows on both sides')
      t.equal((await bob.get(`/v2/message/${await messageIn(page, 'ok, 11 it is').getAttribute('data-id')}`)).json().replyTo,
        await messageIn(page, 'see you at 11').getAttribute('data-id'), 'the send carried replyTo')

      // bob 2 is in alice's loaded pages, not in bob's: his page fetches it for the quote.
      await messageIn(page, 'bob 2').getByRole('button', { name: 'Reply' }).click()
      await byTestId(page, 'body').fill('about that one')
      await byTestId(page, 'send').click()
      for (const p of [page, other]) await messageIn(p, 'about that one').locator('[data-testid="quote"]').filter({ hasText: 'bob 2' }).waitFor()
      t.equal(await messageIn(other, 'bob 2').count(), 0, 'bob 2 is not loaded on bob\'s side')
      // A reply whose original is then deleted.
      t.equal((await bob.post('/v2/message', { recipient: 'alice', body: 'forget that', replyTo: ids[3] })).statusCode, 200)
      await messageIn(page, 'forget that').locator('[data-testid="quote"]').filter({ hasText: 'bob 3' }).waitFor()
      t.equal((await bob.delete(`/v2/message/${ids[3]}`)).statusCode, 204)
      await messageIn(page, 'forget that').locator('[data-testid="quote"]').filter({ hasText: 'The original message was deleted' }).waitFor()
      t.pass('a deleted original is said to be deleted')
    })

    await t.test('reactions: picked, counted on the other side, toggled', async (t) => {
      const target = messageIn(page, 'ok, 11 it is')
      await target.getByRole('button', { name: 'Add a reaction' }).click()
      await target.getByRole('button', { name: 'React with 👍' }).click()
      await target.locator('[data-testid="reaction"][data-emoji="👍"][aria-pressed="true"]').filter({ hasText: '👍 1' }).waitFor()
      const theirs = messageIn(other, 'ok, 11 it is').locator('[data-testid="reaction"][data-emoji="👍"]')
      await theirs.filter({ hasText: '👍 1' }).and(other.locator('[aria-pressed="false"]')).waitFor()
      t.pass('the other side sees the count, live')
      await theirs.click()
      await target.locator('[data-testid="reaction"]').filter({ hasText: '👍 2' }).waitFor()
      t.pass('and its reaction reaches this side')
      await target.locator('[data-testid="reaction"]').click()
      await theirs.filter({ hasText: '👍 1' }).and(other.locator('[aria-pressed="true"]')).waitFor()
      const stored = (await bob.get(`/v2/message/${await target.getAttribute('data-id')}`)).json()
      t.same(stored.reactions, [{ emoji: '👍', count: 1, mine: true }], 'the server holds bob\'s alone')
    })

    await t.test('what arrives in view is read; the server\'s unread stays 0', async (t) => {
      await t.resolves(until(async () => await unread('bob') === 0, { timeoutMs: 5_000, intervalMs: 50 }))
      t.ok(reads.length < 10, `read marks went out a few at a time (${reads.length}), not one per message`)
      t.ok(await fitsWidth(page), 'still no horizontal scroll')
    })

    if (phone) {
      await t.test('on a phone, back leads from the thread to the list, and in again', async (t) => {
        await byTestId(page, 'back').click()
        await conversation(page, 'bob').waitFor()
        t.notOk(await byTestId(page, 'send').isVisible(), 'the thread is put away')
        t.ok(await fitsWidth(page))
        // Not shown, so not read: counted unread in the list and on the server.
        t.equal((await bob.post('/v2/message', { recipient: 'alice', body: 'while you were away' })).statusCode, 200)
        await conversation(page, 'bob').locator('.unread').filter({ hasText: '1' }).waitFor()
        t.equal(await unread('bob'), 1, 'not marked read behind the list')
        await conversation(page, 'bob').click()
        await messageIn(page, 'while you were away').waitFor()
        t.ok(await byTestId(page, 'send').isVisible())
        await t.resolves(until(async () => await unread('bob') === 0, { timeoutMs: 5_000, intervalMs: 50 }), 'read once shown')
      })
    }

    t.same(scriptErrors, [], 'the pages logged no script errors')
  })
}
