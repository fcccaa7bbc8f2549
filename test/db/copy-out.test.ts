import { sql } from 'drizzle-orm'
import t from 'tap'
import { copyOutBinary, literal } from '../../src/db/copy-out.js'
import { queryRows } from '../../src/db/rows.js'
import { transaction } from '../../src/db/transaction.js'
import { freshDatabase, usingPostgres } from '../support/databases.js'

// db/copy-out.ts: a binary COPY answers each stored byte as it is, whatever its value (pg's own
// binary mode decodes values as UTF-8 and so changes them), on both drivers, through the pool or
// a transaction's connection, and gives the connection back whatever happens.

t.test(`a binary COPY answers every row and field as stored, NULLs as null, through the database and a transaction (${usingPostgres() ? 'PostgreSQL' : 'PGlite'})`, async (t) => {
  const fresh = await freshDatabase()
  t.teardown(() => fresh.drop())
  const { db } = fresh.database

  const everyByte = Buffer.from(Array.from({ length: 256 }, (_, i) => i))
  const large = Buffer.alloc(1024 * 1024 + 7)
  for (let i = 0; i < large.length; i++) large[i] = (i * 131 + 17) & 0xff
  await db.execute(sql`CREATE TABLE copied (k int PRIMARY KEY, label text, bytes bytea)`)
  await db.execute(sql`INSERT INTO copied VALUES (1, ${"it's \\ a label é"}, ${everyByte}), (2, NULL, ''::bytea), (3, 'large', ${large}), (4, 'no bytes', NULL)`)

  // A field's bytes whole (the helper hands them over in pieces), or null.
  const whole = (field: Buffer[] | null | undefined) => field === null || field === undefined ? field : Buffer.concat(field)
  const rows = await copyOutBinary(db, sql`SELECT k, label, bytes FROM copied ORDER BY k`)
  t.equal(rows.length, 4, 'every row')
  t.same(rows.map((r) => whole(r[0])?.readInt32BE(0)), [1, 2, 3, 4], 'an int as its four bytes')
  t.equal(whole(rows[0]![1])!.toString('utf8'), "it's \\ a label é", 'text as its UTF-8 bytes')
  t.ok(whole(rows[0]![2])!.equals(everyByte), 'every byte value 0-255 unchanged')
  t.equal(rows[1]![1], null, 'a NULL as null')
  t.equal(whole(rows[1]![2])!.length, 0, 'an empty bytea as an empty buffer, not null')
  t.ok(whole(rows[2]![2])!.equals(large), 'a value of 1 MiB, spanning many reads of the socket, whole')
  t.ok(rows[2]![2]!.every((piece) => piece.length <= 64 * 1024), `in pieces of at most 64 KiB (${rows[2]![2]!.length})`)
  t.equal(rows[3]![2], null, 'a NULL bytea as null')

  const [one] = await copyOutBinary(db, sql`SELECT bytes FROM copied WHERE label = ${literal("it's \\ a label é")}`)
  t.ok(whole(one?.[0])?.equals(everyByte), 'a literal with a quote and a backslash finds its row')
  t.same(await copyOutBinary(db, sql`SELECT bytes FROM copied WHERE k = 99`), [], 'no row: an empty answer')
  await t.rejects(copyOutBinary(db, sql`SELECT bytes FROM copied WHERE k = ${5}`), /literals/, 'a parameter is refused before anything is sent')

  // A transaction's connection, with what it wrote and has not committed.
  await transaction(db, async (tx) => {
    await tx.execute(sql`INSERT INTO copied VALUES (5, 'uncommitted', '\\x00ff'::bytea)`)
    const [row] = await copyOutBinary(tx, sql`SELECT bytes FROM copied WHERE k = 5`)
    t.same([...whole(row![0])!], [0, 255], 'inside a transaction: its own uncommitted row')
  })

  // Failures: the statement's error, never fewer rows, and the connection given back and usable.
  await t.rejects(copyOutBinary(db, sql`SELECT 1 / (k - k) FROM copied`), { code: '22012' }, 'an error in the statement rejects with it')
  await t.rejects(copyOutBinary(db, sql`SELECT x FROM no_such_table`), { code: '42P01' })
  await t.rejects(copyOutBinary(db, sql`SELECT k, CASE WHEN k = 3 THEN 1 / (k - k) ELSE k END AS v FROM copied ORDER BY copied.k`), { code: '22012' },
    'an error after rows went out rejects, rather than answer the rows before it')
  const after = await copyOutBinary(db, sql`SELECT k FROM copied ORDER BY k`)
  t.same(after.map((r) => whole(r[0])?.readInt32BE(0)), [1, 2, 3, 4, 5], 'the next COPY answers its own rows, none the failed one had sent')
  if (usingPostgres()) {
    await t.rejects(copyOutBinary(db, sql`SELECT k, CASE WHEN k = 3 THEN pg_terminate_backend(pg_backend_pid()) END AS v FROM copied ORDER BY copied.k`), /terminat/i,
      'a connection lost mid-COPY rejects')
  }
  const concurrent = await Promise.all(Array.from({ length: 25 }, (_, i) => copyOutBinary(db, sql`SELECT bytes FROM copied WHERE k = ${sql.raw(String(1 + (i % 3)))}`)))
  t.ok(concurrent.every((r, i) => whole(r[0]?.[0])?.equals([everyByte, Buffer.alloc(0), large][i % 3]!)), '25 at once, each its own answer')
  if (usingPostgres()) {
    const stats = fresh.database.stats()
    t.equal(stats.total - stats.idle, 0, 'every connection back in the pool')
  }
  const [count] = await queryRows<{ n: number }>(db, sql`SELECT count(*)::int AS n FROM copied`)
  t.equal(count?.n, 5, 'and the pool still answers')
})
