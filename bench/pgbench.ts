import { execFile } from 'node:child_process'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { promisify } from 'node:util'

/**
 * The SQL of one send written alone (as the service wrote each send before coalescing: one
 * statement, one commit): client i sends as sender<i> to
 * receiver<i>, as the HTTP scenario's connection i does. This is the limit of one commit per
 * send, with no HTTP, JSON, validation or Node in between. The service now coalesces sends
 * (send-lanes.ts, send-batch.repository.ts: many sends, one commit), so it can pass it.
 */
const SEND_TRANSACTION = String.raw`
\set mid random(1, 9223372036854775807)
WITH counted AS (
  INSERT INTO quota_usage (key_id, day, count) SELECT 'pgbench' || :client_id, current_date, 1
  WHERE EXISTS (SELECT 1 FROM users WHERE address = 'receiver' || :client_id) AND 1000000000 > 0
  ON CONFLICT (key_id, day) DO UPDATE SET count = quota_usage.count + 1 WHERE quota_usage.count < 1000000000
  RETURNING count
), feed AS (
  UPDATE users SET event_seq = event_seq + 1 WHERE address = ANY(ARRAY['receiver' || :client_id]) AND EXISTS (SELECT 1 FROM counted)
  RETURNING address, event_seq
), written AS (
  INSERT INTO messages (id, sender, recipient, body, created_at)
  SELECT 'msg_' || :mid, 'sender' || :client_id, 'receiver' || :client_id, 'hello from the benchmark', now()
  WHERE EXISTS (SELECT 1 FROM counted) AND EXISTS (SELECT 1 FROM feed)
  RETURNING id
), delivered AS (
  INSERT INTO deliveries (message_id, recipient) SELECT written.id, feed.address FROM written, feed
), appended AS (
  INSERT INTO events (address, seq, type, data, message_id)
  SELECT feed.address, feed.event_seq, 'message.received',
    ('{"message":{"id":"msg_' || :mid || '","sender":"sender' || :client_id || '","recipient":"receiver' || :client_id ||
     '","body":"hello from the benchmark","attachments":[],"createdAt":"2026-11-22T04:00:00.000Z"}}')::jsonb, written.id
  FROM feed, written
)
SELECT EXISTS (SELECT 1 FROM users WHERE address = 'receiver' || :client_id) AS found, (SELECT count FROM counted) AS used,
  CASE WHEN EXISTS (SELECT 1 FROM written) THEN pg_notify('parley_events', 'receiver' || :client_id) END AS notified;
`

export interface PgbenchResult { clients: number, tps: number, latencyMs: number }

/** Runs the send transaction with pgbench at the given concurrency for `seconds`. */
export async function pgbench (databaseUrl: string, clients: number, seconds: number): Promise<PgbenchResult> {
  const dir = mkdtempSync(join(tmpdir(), 'parley-pgbench-'))
  try {
    const script = join(dir, 'send.sql')
    writeFileSync(script, SEND_TRANSACTION)
    const { stdout } = await promisify(execFile)('pgbench', [
      '--no-vacuum', '--protocol=prepared', `--client=${clients}`, '--jobs=2', `--time=${seconds}`, `--file=${script}`, databaseUrl
    ], { maxBuffer: 16 * 1024 * 1024 })
    const tps = Number(/tps = ([0-9.]+) \(without initial connection time\)/.exec(stdout)?.[1])
    const latencyMs = Number(/latency average = ([0-9.]+) ms/.exec(stdout)?.[1])
    if (!Number.isFinite(tps)) throw new Error(`could not read pgbench's output:\n${stdout}`)
    return { clients, tps, latencyMs }
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
}
