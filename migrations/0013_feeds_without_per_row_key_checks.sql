-- Feeds and deliveries without per-row key checks (issue #15): these three keys were checked on
-- every event and delivery row written, though what writes them proves both ends itself. The
-- send's statement inserts the message and locks each recipient's user row to take its feed
-- ids; every other event is appended in the transaction that took its ids the same way
-- (events.repository.ts). On a send to a group of 20 the checks were a quarter of PostgreSQL's
-- time. See events.table.ts and messages.table.ts.
-- Only the catalog changes, but under exclusive locks, taken at once in the order a send takes
-- them; each waits at most 5 s rather than hold sends queued behind a long read (if one gives
-- up, run `parley migrate` again).
SET LOCAL lock_timeout = '5s';--> statement-breakpoint
LOCK TABLE "users", "messages", "deliveries", "events" IN ACCESS EXCLUSIVE MODE;--> statement-breakpoint
ALTER TABLE "deliveries" DROP CONSTRAINT "deliveries_message_id_messages_id_fk";
--> statement-breakpoint
ALTER TABLE "deliveries" DROP CONSTRAINT "deliveries_recipient_users_address_fk";
--> statement-breakpoint
ALTER TABLE "events" DROP CONSTRAINT "events_address_users_address_fk";
--> statement-breakpoint
-- What the keys did besides checking inserts, kept by triggers that never fire on a send (a
-- send deletes nothing and updates only users.event_seq), for an operator working by hand:
-- a deleted user takes its feed and its deliveries, a deleted message its deliveries (once per
-- deleting statement, over the rows it deleted); TRUNCATE empties what it would orphan; and a
-- user's address or a message's id, which the keys held fixed, still cannot change. They run
-- as their owner with the schema of this migration, as the keys' cascades did.
CREATE FUNCTION "parley_users_deleted"() RETURNS trigger LANGUAGE plpgsql
  SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
  DELETE FROM "events" WHERE "address" IN (SELECT "address" FROM gone);
  DELETE FROM "deliveries" WHERE "recipient" IN (SELECT "address" FROM gone);
  RETURN NULL;
END $$;
--> statement-breakpoint
CREATE TRIGGER "users_deleted" AFTER DELETE ON "users" REFERENCING OLD TABLE AS gone
  FOR EACH STATEMENT EXECUTE FUNCTION "parley_users_deleted"();
--> statement-breakpoint
CREATE FUNCTION "parley_messages_deleted"() RETURNS trigger LANGUAGE plpgsql
  SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
  DELETE FROM "deliveries" WHERE "message_id" IN (SELECT "id" FROM gone);
  RETURN NULL;
END $$;
--> statement-breakpoint
CREATE TRIGGER "messages_deleted" AFTER DELETE ON "messages" REFERENCING OLD TABLE AS gone
  FOR EACH STATEMENT EXECUTE FUNCTION "parley_messages_deleted"();
--> statement-breakpoint
CREATE FUNCTION "parley_users_truncated"() RETURNS trigger LANGUAGE plpgsql
  SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
  TRUNCATE "events", "deliveries";
  RETURN NULL;
END $$;
--> statement-breakpoint
CREATE TRIGGER "users_truncated" AFTER TRUNCATE ON "users"
  FOR EACH STATEMENT EXECUTE FUNCTION "parley_users_truncated"();
--> statement-breakpoint
CREATE FUNCTION "parley_messages_truncated"() RETURNS trigger LANGUAGE plpgsql
  SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
  TRUNCATE "deliveries";
  RETURN NULL;
END $$;
--> statement-breakpoint
CREATE TRIGGER "messages_truncated" AFTER TRUNCATE ON "messages"
  FOR EACH STATEMENT EXECUTE FUNCTION "parley_messages_truncated"();
--> statement-breakpoint
CREATE FUNCTION "parley_key_fixed"() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'the % of a row of % cannot change: events and deliveries name it', TG_ARGV[0], TG_TABLE_NAME
    USING ERRCODE = 'foreign_key_violation';
END $$;
--> statement-breakpoint
CREATE TRIGGER "users_address_fixed" BEFORE UPDATE OF "address" ON "users"
  FOR EACH ROW WHEN (OLD."address" IS DISTINCT FROM NEW."address") EXECUTE FUNCTION "parley_key_fixed"('address');
--> statement-breakpoint
CREATE TRIGGER "messages_id_fixed" BEFORE UPDATE OF "id" ON "messages"
  FOR EACH ROW WHEN (OLD."id" IS DISTINCT FROM NEW."id") EXECUTE FUNCTION "parley_key_fixed"('id');
--> statement-breakpoint
SET LOCAL lock_timeout = DEFAULT;
