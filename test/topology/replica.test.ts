import { existsSync } from 'node:fs'
import { join } from 'node:path'
import { performance } from 'node:perf_hooks'
import { sql } from 'drizzle-orm'
import t from 'tap'
import { connectPostgres } from '../../src/db/client.js'
import { openReplica, type Reads } from '../../src/db/replica.js'
import { queryRows } from '../../src/db/rows.js'
import { createEventsRepository } from '../../src/modules/events/events.repository.js'
import { search } from '../../src/modules/search/search.service.js'
import { usingPostgres } from '../support/databases.js'
import { runCliInProcess, startServer, type ServerProcess } from '../support/processes.js'
import { freezableProxy, replicatedPostgres } from '../support/replicated-postgres.js'
import { postgresBin } from '../support/throwaway-postgres.js'
import { until } from '../support/until.js'
import { installKeyring, Keyring, parseSealingKeys } from '../../src/sealing/keyring.js'
import { TEST_SEALING_KEYS } from '../support/sealing.js'

// This process searches the servers' database itself: with their key, as they seal (API.md §11).
installKeyring(new Keyring(parseSealingKeys(TEST_SEALING_KEYS)))

const bin = postgresBin()
const skip = !usingPostgres()
  ? 'runs in the PostgreSQL pass (it brings a primary and a streaming replica of its own)'
  : bin === undefined || !existsSync(join(bin, 'pg_basebackup'))
    ? 'no PostgreSQL server binaries (initdb, pg_basebackup) on this machine'
    : false

interface Reply { status: number, body: any, ms: number }

/** Reads counted by /metrics, summed over instances: parley_replica_reads_total by reason. */
async function replicaReads (servers: ServerProcess[]): Promise<Record<string, number>> {
  const totals: Record<string, number> = {}
  for (const server of servers) {
    const text = await (await fetch(`${server.url}/metrics`)).text()
    for (const match of text.matchAll(/^parley_replica_reads_total\{served="(\w+)",reason="(\w+)"\} (\d+)$/gm)) {
      const key = `${match[1]}:${match[2]}`
      totals[key] = (totals[key] ?? 0) + Number(match[3])
    }
  }
  return totals
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? 0
const max = (xs: number[]) => Math.max(0, ...xs)

t.test('a read replica serves reads that may lag, never less than the caller wrote, and in trouble costs only latency', { skip }, async (t) => {
  const began = performance.now()
  const elapsed = () => `${((performance.now() - began) / 1000).toFixed(1)} s`
  const cluster = await replicatedPostgres(t, bin!)
  t.comment(`primary and replica running after ${elapsed()}`)
  // The instances reach the replica through a proxy that can make it go quiet.
  const proxy = await freezableProxy(t, Number(new URL(cluster.replicaUrl).port))
  const env = {
    DATABASE_URL: cluster.primaryUrl,
    DATABASE_READ_URL: `postgres://postgres@127.0.0.1:${proxy.port}/parley`,
    RATE_LIMIT_PER_SECOND: '100000',
    DAILY_MESSAGE_QUOTA: '1000000',
    LOG_LEVEL: 'info'
  }
  // The first migrates; the second starts on the migrated database. Two instances, one database.
  const a = await startServer(t, env)
  const b = await startServer(t, env)
  const servers = [a, b]
  t.comment(`two instances listening after ${elapsed()}`)
  const keys: Record<string, string> = {}
  for (const address of ['alice', 'bob']) {
    t.equal((await runCliInProcess(['user', 'create', address], env)).code, 0)
    const key = JSON.parse((await runCliInProcess(['key', 'create', address, '--json'], env)).stdout) as { keyId: string, secret: string }
    keys[address] = `Basic ${Buffer.from(`${key.keyId}:${key.secret}`).toString('base64')}`
  }
  const call = async (server: ServerProcess, as: string, method: string, path: string, body?: unknown): Promise<Reply> => {
    const started = performance.now()
    const res = await fetch(`${server.url}${path}`, {
      method,
      headers: { authorization: keys[as]!, ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
      ...(body === undefined ? {} : { body: JSON.stringify(body) }),
      signal: AbortSignal.timeout(20_000)
    })
    const text = await res.text()
    return { status: res.status, body: text === '' ? undefined : JSON.parse(text), ms: performance.now() - started }
  }

  let fed = 0
  let n = 0
  const run = `${Date.now().toString(36)}`
  /**
   * One trial: alice sends through one instance, then at once reads through the other (or the
   * same): a search for the message's word, the conversation's history, her conversation
   * list, and bob's feed (another caller: a read sees what committed before it arrived). Bob
   * acknowledges the event and reads his feed again: the acknowledged event is gone.
   */
  async function trial (writer: ServerProcess, reader: ServerProcess) {
    const word = `w${run}n${n++}`
    const problems: string[] = []
    const statuses: number[] = []
    const readMs: number[] = []
    const sent = await call(writer, 'alice', 'POST', '/v2/message', { recipient: 'bob', body: `trial ${word}` })
    statuses.push(sent.status)
    if (sent.status !== 200) return { problems: [`send answered ${sent.status}`], statuses, readMs }
    const id = sent.body.id as string
    const reads: [string, Reply, boolean][] = []
    const found = await call(reader, 'alice', 'POST', '/v2/search', { query: word, types: ['messages'] })
    reads.push(['search', found, found.body?.results?.some((r: any) => r.message?.id === id) === true])
    const history = await call(reader, 'alice', 'POST', '/v2/search', { with: 'bob', limit: 1 })
    reads.push(['history', history, history.body?.results?.[0]?.message?.id === id])
    const list = await call(reader, 'alice', 'GET', '/v2/conversations?limit=1')
    reads.push(['conversations', list, list.body?.conversations?.[0]?.lastMessage?.id === id])
    const feed = await call(reader, 'bob', 'GET', `/v2/events?after=${fed}`)
    const event = feed.body?.events?.find((e: any) => e.data?.message?.id === id)
    reads.push(['feed', feed, event !== undefined])
    for (const [name, reply, ok] of reads) {
      statuses.push(reply.status)
      readMs.push(reply.ms)
      if (!ok) problems.push(`${name} (${reply.status}) missed ${id}`)
    }
    if (event !== undefined) {
      const acked = await call(writer, 'bob', 'POST', '/v2/events/ack', { upTo: event.id })
      statuses.push(acked.status)
      const again = await call(reader, 'bob', 'GET', '/v2/events?after=0')
      statuses.push(again.status)
      readMs.push(again.ms)
      if (again.body?.events?.some((e: any) => Number(e.id) <= Number(event.id)) !== false) problems.push(`feed (${again.status}) still shows acknowledged events up to ${event.id}`)
      fed = Number(event.id)
    }
    return { problems, statuses, readMs }
  }

  async function trials (count: number, label: string) {
    const problems: string[] = []
    const statuses: number[] = []
    const readMs: number[] = []
    for (let i = 0; i < count; i++) {
      // Across instances and on the same one, both ways.
      const writer = servers[i % 2]!
      const reader = servers[Math.floor(i / 2) % 2]!
      const one = await trial(writer, reader)
      problems.push(...one.problems)
      statuses.push(...one.statuses)
      readMs.push(...one.readMs)
    }
    const failed = statuses.filter((s) => s >= 500)
    t.same(problems, [], `${label}: every read saw the caller's write (${count} trials)`)
    t.equal(failed.length, 0, `${label}: no 5xx among ${statuses.length} answers`)
    t.comment(`${label} (${elapsed()}): ${count} trials, reads median ${median(readMs).toFixed(1)} ms, max ${max(readMs).toFixed(1)} ms`)
    return { readMs }
  }

  /** Trials until a read is served by the replica again (the probe's back-off is at most 5 s). */
  async function untilServedByReplica (label: string) {
    const before = (await replicaReads(servers))['replica:caught_up'] ?? 0
    // A trial at each look (the counter moves only when reads are made), 250 ms apart.
    await until(async () => {
      await trials(1, `${label} (waiting for the replica)`)
      return ((await replicaReads(servers))['replica:caught_up'] ?? 0) > before
    }, { timeoutMs: 20_000, intervalMs: 250, message: `${label}: reads served by the replica again` })
    t.pass(`${label}: reads are served by the replica again`)
  }

  // (a) A replica that keeps up serves the reads, and each sees the write just made.
  const steady = await trials(200, 'replica streaming')
  const counted = await replicaReads(servers)
  const onReplica = counted['replica:caught_up'] ?? 0
  const all = Object.values(counted).reduce((sum, x) => sum + x, 0)
  t.comment(`replica streaming: reads by outcome ${JSON.stringify(counted)}`)
  t.ok(all >= 200 * 5, 'every search, history, conversation list and feed read is one that may go to the replica')
  t.ok(onReplica >= all / 2, `most of them were served by the replica (${onReplica} of ${all})`)

  // A burst of reads costs the primary a few samples of its WAL position, not one each.
  t.equal((await call(a, 'alice', 'POST', '/v2/message', { recipient: 'bob', body: `burst${run}` })).status, 200)
  await cluster.onPrimary('CREATE EXTENSION IF NOT EXISTS pg_stat_statements', 'SELECT pg_stat_statements_reset()')
  const burst = await Promise.all(Array.from({ length: 60 }, () => call(a, 'alice', 'POST', '/v2/search', { query: `burst${run}`, types: ['messages'] })))
  t.same(burst.filter((r) => r.status !== 200 || r.body.results.length !== 1).map((r) => [r.status, r.body]), [], '60 searches at once, each right')
  const [sampled] = await cluster.onPrimary("SELECT coalesce(sum(calls), 0)::int AS calls FROM pg_stat_statements WHERE query LIKE '%pg_current_wal_flush_lsn%'")
  t.ok(Number(sampled!.calls) <= 15, `the primary was asked its WAL position ${sampled!.calls} times for 60 reads`)

  // (b) Replay paused: the replica falls behind. What it would answer is stale...
  await cluster.onReplica('SELECT pg_wal_replay_pause()')
  const replica = await connectPostgres(cluster.replicaUrl, 2)
  const blind: Reads = { run: (work) => work(replica.db) }
  let stale = 0
  for (let i = 0; i < 5; i++) {
    const word = `blind${run}n${i}`
    const sent = await call(a, 'alice', 'POST', '/v2/message', { recipient: 'bob', body: word })
    const result = await search(blind, { viewer: 'alice', query: word, limit: 10 })
    const feed = await createEventsRepository(replica.db).page('bob', fed, 100, 1 << 20)
    if (!result.results.some((r) => r.type === 'message' && r.message.id === sent.body.id)) stale++
    if (!feed.some((e) => (e.data as any)?.message?.id === sent.body.id)) stale++
  }
  t.equal(stale, 10, 'a replica read without the wait for replay misses the write (search and feed, 5 times each)')

  // A replica whose default isolation is repeatable read (a reporting replica's setting): a read
  // that waits for replay must not take its snapshot while it waits, or it misses the write.
  {
    const primary = await connectPostgres(cluster.primaryUrl, 2)
    const url = new URL(cluster.replicaUrl)
    url.searchParams.set('options', '-c default_transaction_isolation=repeatable\\ read')
    const reads = await openReplica({ primary: primary.db, url: url.toString(), poolSize: 2, maxWaitMs: 3_000 })
    // Found up by its first probe despite the pause? It has to be, to serve: resume for that.
    await cluster.onReplica('SELECT pg_wal_replay_resume()')
    await until(() => reads.status().state === 'up', { intervalMs: 50, message: 'the replica found up' })
    await cluster.onReplica('SELECT pg_wal_replay_pause()')
    const word = `isolated${run}`
    const sent = await call(a, 'alice', 'POST', '/v2/message', { recipient: 'bob', body: word })
    // Replay resumed once the read waits for it: its transaction open on the replica, between
    // two looks at the replay position (idle in transaction) or in a look after the first.
    const waiting = async () => (await queryRows<{ n: number }>(replica.db, sql`
      SELECT count(*)::int AS n FROM pg_stat_activity
      WHERE pid <> pg_backend_pid() AND query LIKE '%pg_last_wal_replay_lsn%'
        AND (state = 'idle in transaction' OR (state = 'active' AND xact_start < query_start))`))[0]!.n > 0
    const resumed = until(waiting, { intervalMs: 20, message: 'the read waiting for replay' })
      .then(() => cluster.onReplica('SELECT pg_wal_replay_resume()'))
    const found = await search(reads, { viewer: 'alice', query: word, limit: 10 })
    await resumed
    t.ok(found.results.some((r) => r.type === 'message' && r.message.id === sent.body.id),
      'a read that waited for replay on a repeatable-read replica sees the write')
    await cluster.onReplica('SELECT pg_wal_replay_pause()')
    await reads.close()
    await primary.close()
  }
  // ...yet the service's reads stay right, on the primary, and fast.
  const paused = await trials(30, 'replica paused')
  const afterPause = await replicaReads(servers)
  t.comment(`replica paused: reads by outcome ${JSON.stringify(afterPause)}`)
  t.ok((afterPause['primary:behind'] ?? 0) > (counted['primary:behind'] ?? 0), 'reads went to the primary because the replica was behind')
  const bound = Math.max(3 * median(steady.readMs), median(steady.readMs) + 100)
  t.ok(median(paused.readMs) <= bound, `a paused replica costs little: median ${median(paused.readMs).toFixed(1)} ms (streaming ${median(steady.readMs).toFixed(1)} ms; bound ${bound.toFixed(0)})`)
  t.ok(max(paused.readMs) < 2_000, `no read waited long: max ${max(paused.readMs).toFixed(1)} ms`)

  // (d) Replay resumed: reads go back to the replica.
  await cluster.onReplica('SELECT pg_wal_replay_resume()')
  await untilServedByReplica('replay resumed')

  // (c) Replica stopped: no 5xx, reads still right.
  await replica.close()
  await cluster.stopReplica()
  const stopped = await trials(30, 'replica stopped')
  const afterStop = await replicaReads(servers)
  t.comment(`replica stopped: reads by outcome ${JSON.stringify(afterStop)}`)
  t.ok((afterStop['primary:unavailable'] ?? 0) > (afterPause['primary:unavailable'] ?? 0), 'reads went to the primary because the replica was unavailable')
  t.ok(median(stopped.readMs) <= bound, `a stopped replica costs little: median ${median(stopped.readMs).toFixed(1)} ms`)
  t.ok(max(stopped.readMs) < 3_000, `no read waited long: max ${max(stopped.readMs).toFixed(1)} ms`)

  // (d) Replica started again: reads go back to it.
  await cluster.startReplica()
  await untilServedByReplica('replica restarted')
  await trials(20, 'replica restarted')

  // (c) The replica goes quiet without a word (its host gone, connections half-open): a look
  // at it has 1 s to answer, then reads skip it until a probe finds it again.
  const unavailableBefore = (await replicaReads(servers))['primary:unavailable'] ?? 0
  proxy.freeze()
  const silent = await trials(30, 'replica gone quiet')
  t.ok(((await replicaReads(servers))['primary:unavailable'] ?? 0) > unavailableBefore, 'reads went to the primary because the replica was unavailable')
  t.ok(median(silent.readMs) <= bound, `a quiet replica costs little: median ${median(silent.readMs).toFixed(1)} ms`)
  t.ok(max(silent.readMs) < 3_000, `the read that found it quiet waited ${max(silent.readMs).toFixed(1)} ms`)
  proxy.thaw()
  await untilServedByReplica('replica answering again')

  /**
   * An idle primary at the start of a WAL segment (after a switch): the replica has replayed
   * everything, so it serves, whichever position is read (the insert position then points
   * past the page header, where replay stops before it).
   *
   * "Idle" is checked, not assumed: the instances write in the background (a key's lastUsedAt,
   * once a minute) and so may autovacuum, and under asynchronous commit such WAL holds reads
   * back until the WAL writer flushes it, which is the documented cost, not this claim. A try
   * whose primary inserted WAL meanwhile is taken again (at most three); one whose primary
   * stayed idle must have been served by the replica, all ten reads.
   */
  async function idleAtSegmentStart (label: string) {
    const insertPosition = async () => String((await cluster.onPrimary('SELECT pg_current_wal_insert_lsn()::text AS lsn'))[0]!.lsn)
    for (let attempt = 1; ; attempt++) {
      const word = `idle${run}n${n++}`
      t.equal((await call(a, 'alice', 'POST', '/v2/message', { recipient: 'bob', body: word })).status, 200)
      await cluster.onPrimary('SELECT pg_switch_wal()')
      const idleFrom = await insertPosition()
      // No writes now: wait for both instances' probes to find the replica up.
      await until(async () => {
        const texts = await Promise.all(servers.map(async (s) => (await fetch(`${s.url}/metrics`)).text()))
        return texts.every((text) => /^parley_replica_up 1$/m.test(text))
      }, { timeoutMs: 15_000, intervalMs: 50, message: `${label}: the replica up on both instances` })
      const before = (await replicaReads(servers))['replica:caught_up'] ?? 0
      let found = 0
      for (let i = 0; i < 10; i++) {
        const reply = await call(servers[i % 2]!, 'alice', 'POST', '/v2/search', { query: word, types: ['messages'] })
        if (reply.body?.results?.length === 1) found++
      }
      const served = ((await replicaReads(servers))['replica:caught_up'] ?? 0) - before
      // Wherever they ran, idle or not, every read saw the caller's write.
      t.equal(found, 10, `${label}: every read found the message (try ${attempt})`)
      const idle = await insertPosition() === idleFrom
      if (!idle && attempt < 3) {
        t.comment(`${label}: the primary wrote WAL during try ${attempt} (${served} of 10 served by the replica); again`)
        continue
      }
      t.ok(idle, `${label}: the primary stayed idle from the switch to the last read (try ${attempt})`)
      t.equal(served, 10, `${label}: an idle primary at a segment's start is not ahead of a replica that replayed it all`)
      return
    }
  }
  await idleAtSegmentStart('synchronous commit')

  // Commits acknowledged before their WAL is written (synchronous_commit = off): the position
  // read is then the insert position, which lies past them, not the flush position.
  await cluster.onPrimary('ALTER SYSTEM SET synchronous_commit = off', 'SELECT pg_reload_conf()')
  await trials(30, 'asynchronous commit')
  t.comment(`asynchronous commit: reads by outcome ${JSON.stringify(await replicaReads(servers))}`)
  await idleAtSegmentStart('asynchronous commit')
  await cluster.onPrimary('ALTER SYSTEM RESET synchronous_commit', 'SELECT pg_reload_conf()')

  // A read that found the replica behind (asynchronous commit's cost) leaves it skipped until
  // the next probe, a quarter of a second later.
  let metrics = ''
  await until(async () => /^parley_replica_up 1$/m.test(metrics = await (await fetch(`${a.url}/metrics`)).text()),
    { timeoutMs: 15_000, intervalMs: 50, message: 'the replica up again in /metrics' })
  t.match(metrics, /^parley_replica_up 1$/m, 'the replica is up again in /metrics')
  t.match(metrics, /^parley_replica_lag_bytes \d+$/m, 'and its lag in bytes')
  t.match(metrics, /^parley_replica_lag_seconds [0-9.e+-]+$/m, 'and in seconds')
  for (const server of servers) t.notMatch(server.output(), /"level":50/, 'no error in the log')
})
