import { sql } from 'drizzle-orm'
import type { Db } from '../../../src/db/client.js'
import { queryRows } from '../../../src/db/rows.js'

/**
 * Records a retention sweep as made just now, so the app's own timer (its first sweep 5 s after
 * start, then one per 9 minutes at least) finds the period claimed and leaves the purging to the
 * test's purgeExpired calls, whose counts it then checks (those pass minIntervalMs 0).
 */
export async function holdOffAppSweeps (db: Db): Promise<void> {
  await db.execute(sql`INSERT INTO instance_settings (key, value, updated_at) VALUES ('retention_swept', 'true'::jsonb, now())
    ON CONFLICT (key) DO UPDATE SET updated_at = now()`)
}

/** Moves messages back in time, as if sent `days` days ago (the database's clock decides age). */
export async function age (db: Db, ids: string[], days: number): Promise<void> {
  await db.execute(sql`UPDATE messages SET created_at = now() - make_interval(days => ${days}) WHERE id = ANY(${sql.param(ids)}::text[])`)
}

/** Rows of `table` (a fixed name from the test) whose `column` is one of `ids`. */
export async function rowsAbout (db: Db, table: string, column: string, ids: string[]): Promise<number> {
  const [row] = await queryRows<{ n: number }>(db, sql`SELECT count(*)::int AS n FROM ${sql.identifier(table)} WHERE ${sql.identifier(column)} = ANY(${sql.param(ids)}::text[])`)
  return row!.n
}

export async function countRows (db: Db, table: string): Promise<number> {
  const [row] = await queryRows<{ n: number }>(db, sql`SELECT count(*)::int AS n FROM ${sql.identifier(table)}`)
  return row!.n
}

/**
 * `count` messages from `sender` to `recipient` (a user, or a group whose members are
 * `readers`), `days` days old, written straight into the tables as years of use would leave
 * them: a delivery row and a message.received event per reader (recent events, so only the
 * message purge takes them), one message in ten with a reaction. Ids sort before any the
 * service makes (`msg_0…`), in `label` order. Answers the ids.
 */
export async function insertOldMessages (db: Db, input: { label: number, sender: string, recipient: string, readers: string[], count: number, days: number }): Promise<string[]> {
  const prefix = `msg_0${String(input.label).padStart(4, '0')}`
  const ids = await queryRows<{ id: string }>(db, sql`
    INSERT INTO messages (id, sender, recipient, body, created_at)
    SELECT ${prefix} || lpad(g::text, 21, '0'), ${input.sender}, ${input.recipient}, 'old words ' || g,
      now() - make_interval(days => ${input.days}) - g * interval '1 second'
    FROM generate_series(1, ${input.count}) g
    RETURNING id`)
  const list = ids.map((r) => r.id)
  for (const reader of input.readers) {
    await db.execute(sql`INSERT INTO deliveries (message_id, recipient) SELECT unnest(${sql.param(list)}::text[]), ${reader}`)
    // Feed ids past the feed's end, and the feed moved on past them, as sends would have left it.
    await db.execute(sql`
      WITH feed AS (SELECT event_seq FROM users WHERE address = ${reader}),
      added AS (
        INSERT INTO events (address, seq, type, data, message_id)
        SELECT ${reader}, (SELECT event_seq FROM feed) + o, 'message.received', jsonb_build_object('message', jsonb_build_object('id', id)), id
        FROM unnest(${sql.param(list)}::text[]) WITH ORDINALITY AS m(id, o)
      )
      UPDATE users SET event_seq = event_seq + ${list.length} WHERE address = ${reader}`)
  }
  await db.execute(sql`INSERT INTO message_reactions (message_id, emoji, address)
    SELECT id, '👍', ${input.sender} FROM unnest(${sql.param(list)}::text[]) WITH ORDINALITY AS m(id, o) WHERE o % 10 = 0`)
  return list
}
