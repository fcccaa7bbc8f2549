import t from 'tap'
import { build } from '../../helper.js'

t.test('GET /metrics reports requests, sends, refusals, open long-polls and connections in Prometheus text', async (t) => {
  const { app, as } = await build(t, { env: { RATE_LIMIT_PER_SECOND: '3' } })
  const alice = await as('alice', { dailyQuota: 1 })
  const bob = await as('bob')
  t.equal((await alice.post('/v2/message', { recipient: 'bob', body: 'one' })).statusCode, 200)
  t.equal((await alice.post('/v2/message', { recipient: 'bob', body: 'two' })).statusCode, 429)
  await new Promise((resolve) => setTimeout(resolve, 1_100))
  const burst = await Promise.all(Array.from({ length: 5 }, () => bob.get('/v2/user/bob')))
  t.ok(burst.some((r) => r.statusCode === 429))
  await new Promise((resolve) => setTimeout(resolve, 1_100))
  const poll = bob.get('/v2/events?after=1&wait=5')
  await new Promise((resolve) => setTimeout(resolve, 300))

  const res = await app.inject({ method: 'GET', url: '/metrics' })
  t.equal(res.statusCode, 200)
  t.match(res.headers['content-type'], /^text\/plain; version=0\.0\.4/)
  const text = res.body
  t.match(text, /^parley_http_requests_total\{method="POST",route="\/v2\/message",status="200"\} 1$/m)
  t.match(text, /^parley_http_requests_total\{method="POST",route="\/v2\/message",status="429"\} 1$/m)
  t.match(text, /^parley_http_request_duration_seconds_bucket\{method="POST",route="\/v2\/message",le="\+Inf"\} 2$/m)
  t.match(text, /^parley_messages_sent_total 1$/m)
  t.match(text, /^parley_refusals_total\{reason="quota"\} 1$/m)
  t.match(text, /^parley_refusals_total\{reason="rate_limit"\} [1-9]/m)
  t.match(text, /^parley_long_polls_open 1$/m)
  t.match(text, /^parley_db_connections\{state="total"\} \d+$/m)
  await app.inject({ method: 'GET', url: '/no/such/path' })
  t.match((await app.inject({ method: 'GET', url: '/metrics' })).body, /route="unmatched",status="404"/)
  t.same((await poll).json(), { events: [], last: '1' })
})
