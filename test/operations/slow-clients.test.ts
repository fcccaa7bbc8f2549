import { connect, type Socket } from 'node:net'
import t from 'tap'
import { childDatabaseEnv, runCliInProcess, startServer } from '../support/processes.js'

/**
 * Slow-loris clients against a real listening server: a request trickled in byte by byte is
 * cut off once REQUEST_TIMEOUT_SECONDS (2 here) has passed, while a long-poll that waits
 * longer than that, its request already in, is answered normally.
 */
t.test('slow clients are cut off; long-polls are not', async (t) => {
  const env = { ...await childDatabaseEnv(t), REQUEST_TIMEOUT_SECONDS: '2' }
  t.equal((await runCliInProcess(['user', 'create', 'slowpoke'], env)).code, 0)
  const key = JSON.parse((await runCliInProcess(['key', 'create', 'slowpoke', '--json'], env)).stdout) as { keyId: string, secret: string }
  const authorization = `Basic ${Buffer.from(`${key.keyId}:${key.secret}`).toString('base64')}`
  const server = await startServer(t, env)
  const { hostname, port } = new URL(server.url)

  /** Opens a socket, writes `head` at once, then `drip` every 200 ms until the server closes it. */
  const trickle = (head: string, drip: string) => new Promise<{ closedAfterMs: number, answer: string }>((resolve, reject) => {
    const started = Date.now()
    const socket: Socket = connect(Number(port), hostname)
    let answer = ''
    let timer: NodeJS.Timeout | undefined
    const giveUp = setTimeout(() => { socket.destroy(); reject(new Error('the server kept a trickling request open for 15 s')) }, 15_000)
    socket.on('connect', () => {
      socket.write(head)
      timer = setInterval(() => { if (!socket.destroyed && socket.writable) socket.write(drip) }, 200)
    })
    socket.on('data', (chunk) => { answer += chunk.toString() })
    socket.on('error', () => {}) // a reset after the server gave up is the expected ending
    socket.on('close', () => {
      clearInterval(timer)
      clearTimeout(giveUp)
      resolve({ closedAfterMs: Date.now() - started, answer })
    })
  })

  // The three clients at once: each is timed on its own connection, and none waits for another.
  const headers = trickle('GET /v2/user/slowpoke HTTP/1.1\r\nHost: x\r\n', 'X-Drip: 1\r\n')
  const body = trickle(`POST /v2/message HTTP/1.1\r\nHost: x\r\nAuthorization: ${authorization}\r\n` +
    'Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"recipient":"testbot","body":"', 'a')
  const polled = Date.now()
  const poll = fetch(`${server.url}/v2/events?wait=4`, { headers: { authorization } }).then((res) => ({ status: res.status, ms: Date.now() - polled }))
  // Handled now, so that none rejects unheard while another is awaited.
  for (const p of [headers, body, poll]) void p.catch(() => {})

  await t.test('headers sent one line at a time', async (t) => {
    const { closedAfterMs, answer } = await headers
    t.ok(closedAfterMs >= 1_800 && closedAfterMs < 6_000, `closed after ${closedAfterMs} ms`)
    t.match(answer, /^(HTTP\/1\.1 408|)/, 'a 408 or a closed socket')
  })

  await t.test('a body sent one byte at a time', async (t) => {
    const { closedAfterMs, answer } = await body
    t.ok(closedAfterMs >= 1_800 && closedAfterMs < 6_000, `closed after ${closedAfterMs} ms`)
    t.notMatch(answer, /^HTTP\/1\.1 200/, 'the half-sent message was not accepted')
  })

  await t.test('a long-poll outlives the request timeout', async (t) => {
    const { status, ms } = await poll
    t.equal(status, 200)
    t.ok(ms >= 3_500, `answered after ${ms} ms`)
  })

  await t.test('the server still answers normal requests', async (t) => {
    const res = await fetch(`${server.url}/v2/user/slowpoke`, { headers: { authorization } })
    t.equal(res.status, 200)
    const sent = await fetch(`${server.url}/v2/message`, {
      method: 'POST',
      headers: { authorization, 'content-type': 'application/json' },
      body: JSON.stringify({ recipient: 'testbot', body: 'still here' })
    })
    t.equal(sent.status, 200)
  })
})
