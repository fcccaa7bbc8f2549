import { performance } from 'node:perf_hooks'
import { sql } from 'drizzle-orm'
import type { Db } from './client.js'
import { queryRows } from './rows.js'

/*
 * The primary's WAL position, for replica reads (replica.ts says why this position and how it
 * is used).
 */

/** 'X/Y' (hexadecimal halves) as one number. */
export function parseLsn (text: string): bigint {
  const [high, low] = text.split('/')
  return (BigInt(`0x${high}`) << 32n) | BigInt(`0x${low}`)
}

/**
 * An insert position at the start of a WAL page points past the page header (40 bytes at the
 * start of a segment, 24 on other pages, on 64-bit builds); a record can never end inside a
 * header, and replay stops at the page's start. Mapping the one onto the other keeps an idle
 * primary from looking ahead of a replica that has replayed everything.
 */
export function normalizePosition (lsn: bigint, segmentBytes: bigint, pageBytes: bigint): bigint {
  if (lsn % segmentBytes === 40n) return lsn - 40n
  if (lsn % pageBytes === 24n) return lsn - 24n
  return lsn
}

/**
 * The primary's WAL position, sampled at most once per round trip: the latest sample serves
 * every request that arrived before it was sent (answered or still in flight); a request that
 * arrived later waits for the next, of which there is at most one queued behind the one in
 * flight.
 */
export function positionSampler (primary: Db): (arrivedAt: number) => Promise<bigint> {
  let latest: { sentAt: number, position: Promise<bigint> } | undefined
  let inFlight = false
  let queued: Promise<bigint> | undefined
  const send = (): Promise<bigint> => {
    const sample = {
      sentAt: performance.now(),
      position: queryRows<{ lsn: string, segment: string, page: string }>(primary, sql`
        SELECT (CASE WHEN current_setting('synchronous_commit') = 'off' THEN pg_current_wal_insert_lsn()
            ELSE pg_current_wal_flush_lsn() END)::text AS lsn,
          pg_size_bytes(current_setting('wal_segment_size'))::text AS segment,
          current_setting('wal_block_size') AS page`)
        .then(([row]) => normalizePosition(parseLsn(row!.lsn), BigInt(row!.segment), BigInt(row!.page)))
    }
    latest = sample
    inFlight = true
    sample.position.then(() => { inFlight = false }, () => {
      inFlight = false
      // A failed sample serves no one after it.
      if (latest === sample) latest = undefined
    })
    return sample.position
  }
  return (arrivedAt) => {
    if (latest !== undefined && latest.sentAt >= arrivedAt) return latest.position
    if (queued !== undefined) return queued
    if (!inFlight || latest === undefined) return send()
    const next = latest.position.then(() => {}, () => {}).then(() => {
      queued = undefined
      return send()
    })
    queued = next
    return next
  }
}
