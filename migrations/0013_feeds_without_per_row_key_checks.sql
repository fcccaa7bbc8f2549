-- Feeds and deliveries without per-row key checks (issue #15): each of these keys was checked
-- on every event and delivery row a send writes, though the statement writing them has just
-- inserted the message and locked each recipient's user row to take its feed ids. See events.table.ts.
-- Only the catalog changes, under exclusive locks on the four tables: behind a long read it
-- would hold every send queued behind it, so it gives up after 5 s (run `parley migrate` again).
SET LOCAL lock_timeout = '5s';--> statement-breakpoint
ALTER TABLE "deliveries" DROP CONSTRAINT "deliveries_message_id_messages_id_fk";
--> statement-breakpoint
ALTER TABLE "deliveries" DROP CONSTRAINT "deliveries_recipient_users_address_fk";
--> statement-breakpoint
ALTER TABLE "events" DROP CONSTRAINT "events_address_users_address_fk";
--> statement-breakpoint
-- The dropped keys' ON DELETE CASCADE, kept by triggers: nothing on the send path deletes, so
-- they cost a send nothing. Once per deleting statement, over the rows it deleted.
CREATE FUNCTION "parley_user_deleted"() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  DELETE FROM "events" WHERE "address" IN (SELECT "address" FROM gone);
  DELETE FROM "deliveries" WHERE "recipient" IN (SELECT "address" FROM gone);
  RETURN NULL;
END $$;
--> statement-breakpoint
CREATE TRIGGER "users_deleted" AFTER DELETE ON "users" REFERENCING OLD TABLE AS gone
  FOR EACH STATEMENT EXECUTE FUNCTION "parley_user_deleted"();
--> statement-breakpoint
CREATE FUNCTION "parley_message_deleted"() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  DELETE FROM "deliveries" WHERE "message_id" IN (SELECT "id" FROM gone);
  RETURN NULL;
END $$;
--> statement-breakpoint
CREATE TRIGGER "messages_deleted" AFTER DELETE ON "messages" REFERENCING OLD TABLE AS gone
  FOR EACH STATEMENT EXECUTE FUNCTION "parley_message_deleted"();
--> statement-breakpoint
SET LOCAL lock_timeout = DEFAULT;
