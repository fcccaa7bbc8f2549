import t from 'tap'
import { build } from '../../helper.js'
import { metric } from '../../support/metrics.js'
import { childDatabaseEnv, startServer } from '../../support/processes.js'
import { until } from '../../support/until.js'

t.test('GET /metrics reports requests, sends, refusals, open long-polls and connections in Prometheus text', async (t) => {
  const { app, as, callerFor, createKey } = await build(t, { env: { RATE_LIMIT_PER_SECOND: '3' } })
  const alice = await as('alice', { dailyQuota: 1 })
  const bob = await as('bob')
  t.equal((await alice.post('/v2/message', { recipient: 'bob', body: 'one' })).statusCode, 200)
  t.equal((await alice.post('/v2/message', { recipient: 'bob', body: 'two' })).statusCode, 429)
  // Rate limits are per key: bob's burst, and then his long-poll on a key of its own, wait for
  // no bucket to refill.
  const burst = await Promise.all(Array.from({ length: 5 }, () => bob.get('/v2/user/bob')))
  t.ok(burst.some((r) => r.statusCode === 429))
  const bobsOtherKey = callerFor('bob', await createKey('bob'))
  const poll = bobsOtherKey.get('/v2/events?after=1&wait=5')
  await until(async () => await metric(app, 'parley_long_polls_open') === 1, { message: 'the long-poll never waited' })

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
  t.match(text, /^parley_db_named_statements 1$/m, 'named statements: no pooler declared')
  await app.inject({ method: 'GET', url: '/no/such/path' })
  t.match((await app.inject({ method: 'GET', url: '/metrics' })).body, /route="unmatched",status="404"/)
  t.same((await poll).json(), { events: [], last: '1' })
})

t.test('GET /metrics includes the standard process and Node.js metrics', async (t) => {
  const { app } = await build(t)
  const text = (await app.inject({ method: 'GET', url: '/metrics' })).body
  t.match(text, /^process_resident_memory_bytes \d+$/m)
  t.match(text, /^process_cpu_seconds_total [\d.e+-]+$/m)
  t.match(text, /^nodejs_eventloop_lag_p99_seconds [\d.e+-]+$/m)
  t.match(text, /^nodejs_heap_size_used_bytes \d+$/m)
  t.equal(text.match(/^# TYPE process_resident_memory_bytes /gm)?.length, 1, 'each series once')
})

t.test('METRICS_PORT serves GET /metrics on a listener of its own, and the API port no longer does', async (t) => {
  const server = await startServer(t, { ...await childDatabaseEnv(t), METRICS_PORT: '0' })
  // Logged just after the API's own "Server listening" line.
  const logged = () => /Metrics listening at (http:\/\/127\.0\.0\.1:\d+\/metrics)/.exec(server.output())?.[1]
  await until(() => logged() !== undefined, { timeoutMs: 5_000, message: 'the metrics address was never logged' })
  const url = logged()
  t.ok(url, 'the metrics address is logged')
  const res = await fetch(url!)
  t.equal(res.status, 200)
  t.match(res.headers.get('content-type'), /^text\/plain; version=0\.0\.4/)
  t.match(await res.text(), /^parley_http_requests_total/m)
  t.equal((await fetch(url!.replace('/metrics', '/healthz'))).status, 404, 'only /metrics there')
  t.equal((await fetch(`${server.url}/metrics`)).status, 404)
  t.equal((await fetch(`${server.url}/healthz`)).status, 200)
  t.equal(await server.stop(), 0, 'both listeners close on SIGTERM')
})
