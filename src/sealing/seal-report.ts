import type { SealPassResult } from './reseal.js'
import { keyIdsIn, retiringKeys, type SealStatus } from './seal-status.js'

/**
 * What `parley seal status` and `parley seal rotate` print for people: the counts as a table,
 * key ids SEALING_KEYS does not hold flagged, and after a rotation which keys may go.
 */

function table (rows: string[][]): string {
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => r[i]!.length)))
  return rows.map((r) => r.map((cell, i) => cell.padEnd(widths[i]!)).join('  ').trimEnd()).join('\n')
}

export function statusText (status: SealStatus, configured: readonly string[], active: string): string {
  const ids = [...new Set([...configured, ...keyIdsIn(status)])]
  const heading = (id: string) => id === active ? `${id} (seals)` : configured.includes(id) ? id : `${id} (MISSING)`
  const rows = [
    ['TABLE', 'PLAIN', ...ids.map(heading)],
    ...status.tables.map((t) => [t.table, String(t.plain), ...ids.map((id) => String(t.byKey[id] ?? 0))]),
    ['idempotency_keys', String(status.idempotencyKeys.plain), ...ids.map((id) => String(status.idempotencyKeys.byKey[id]?.records ?? 0))]
  ]
  const lines = [table(rows)]
  const plain = status.tables.reduce((sum, t) => sum + t.plain, 0)
  if (plain > 0) lines.push(`${plain} record(s) are still plain: \`parley migrate\` (or the next start) seals them.`)
  for (const id of ids.filter((id) => !configured.includes(id))) {
    const records = status.tables.reduce((sum, t) => sum + (t.byKey[id] ?? 0), 0)
    if (records > 0) lines.push(`Key ${id} is not in SEALING_KEYS: its ${records} record(s) answer 503 SEALED_KEY_MISSING until it is added back.`)
  }
  lines.push('(events: message events only; idempotency_keys are never re-sealed, they expire 24 h after the send)')
  return lines.join('\n')
}

export function rotateText (result: SealPassResult, status: SealStatus, configured: readonly string[], active: string): string {
  const lines = [`Re-sealed ${result.sealed} record(s) under ${active}.`]
  if (result.broken.length > 0) {
    lines.push(`${result.broken.length} record(s) do not open under their own key (changed in the database?) and were left as they are, e.g. ${result.broken.slice(0, 3).join(', ')}.`)
  }
  if (result.skipped > 0) {
    lines.push(`${result.skipped} record(s) kept changing while the pass ran (an instance still sealing under an old key?): run \`parley seal rotate\` again once every instance has the new SEALING_KEYS.`)
  }
  for (const key of retiringKeys(status, configured, active)) {
    if (key.records > 0) lines.push(`Key ${key.keyId} still seals ${key.records} record(s): keep it.`)
    else if (key.idempotencyUntil !== undefined) lines.push(`Key ${key.keyId} can be dropped from SEALING_KEYS after ${key.idempotencyUntil}, when its last idempotency records (retries of sends) expire.`)
    else lines.push(`Key ${key.keyId} can be dropped from SEALING_KEYS now.`)
  }
  return lines.join('\n')
}
