import { join } from 'node:path'
import { chromium, type Page } from 'playwright-core'
import t from 'tap'
import { build } from '../helper.js'
import { CHROMIUM_ARGS, chromiumPath } from '../support/chromium.js'
import { makePng } from '../support/png.js'
import { until } from '../support/until.js'

const executablePath = chromiumPath()
const skip = executablePath === undefined
  ? 'Chromium is not installed (apt-get install chromium): the web console\'s browser test is skipped'
  : false
if (skip !== false) t.comment(`NOTE: ${skip}`)

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
  /** The rendered message whose body is exactly `text` (or starts with it, for a RegExp). */
  const message = (text: string | RegExp) => byTestId('message').filter({ has: page.locator('.body').getByText(text, { exact: true }) })

  await page.goto(url)
  const served = await page.request.get(url)
  t.match(served.headers()['content-security-policy'], /script-src 'self'/, 'the page is served with a strict CSP')
  t.notMatch(served.headers()['content-security-policy'], /unsafe-(inline|eval)/)

  await t.test('a wrong secret keeps you out', async (t) => {
    await byTestId('key-id').fill(alice.keyId)
    await byTestId('secret').fill('not-the-secret')
    await byTestId('sign-in').click()
    await page.locator('#sign-in-error').filter({ hasText: 'Wrong key id or secret' }).waitFor()
    t.notOk(await byTestId('signed-in-as').isVisible(), 'not signed in')
    t.equal(await page.evaluate(() => sessionStorage.length), 0, 'nothing stored')
  })

  await t.test('signing in shows who you are', async (t) => {
    await byTestId('key-id').fill(alice.keyId)
    await byTestId('secret').fill(alice.secret)
    await byTestId('sign-in').click()
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
    if (process.env.PARLEY_SCREENSHOT !== undefined) {
      await page.screenshot({ path: join(import.meta.dirname, '..', '..', 'docs', 'console.png') })
    }
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
    await other.locator('[data-testid="key-id"]').fill(alice.keyId)
    await other.locator('[data-testid="secret"]').fill(alice.secret)
    await other.locator('[data-testid="sign-in"]').click()
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
    await polling.locator('[data-testid="key-id"]').fill(alice.keyId)
    await polling.locator('[data-testid="secret"]').fill(alice.secret)
    await polling.locator('[data-testid="sign-in"]').click()
    await polling.locator('#connection').filter({ hasText: 'live (polling)' }).waitFor()
    t.equal((await bob.post('/v2/message', { recipient: 'alice', body: 'heard by polling' })).statusCode, 200)
    await polling.locator('[data-testid="conversation"]').filter({ hasText: 'bob' }).click()
    await polling.locator('[data-testid="message"] .body').getByText('heard by polling', { exact: true }).waitFor()
    t.pass('a message arrived by long-poll')
    await polling.close()
  })

  t.same(scriptErrors, [], 'the page logged no script errors')
})
