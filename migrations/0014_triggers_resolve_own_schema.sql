-- The triggers of 0013 run as their owner (SECURITY DEFINER) with `SET search_path FROM CURRENT`,
-- which names no pg_temp, and PostgreSQL then searches a session's temporary schema FIRST: a
-- session that made a temporary table "deliveries" (or "events") and deleted a user or a message
-- by hand had the trigger delete from its own temporary table, leaving the real rows orphaned,
-- and a definer's function resolving a caller's objects is how such functions are subverted.
-- Each function is replaced (its triggers follow it by oid) with every table qualified by the
-- schema the migrations run in, and search_path set to that schema with pg_temp last. The
-- transition table "gone" is the trigger's own (it is found before any table of that name).
DO $migration$
DECLARE
  s text := current_schema();
BEGIN
  EXECUTE format($f$
    CREATE OR REPLACE FUNCTION %1$I."parley_users_deleted"() RETURNS trigger LANGUAGE plpgsql
      SECURITY DEFINER SET search_path = %1$I, pg_temp AS $body$
    BEGIN
      DELETE FROM %1$I."events" WHERE "address" IN (SELECT "address" FROM gone);
      DELETE FROM %1$I."deliveries" WHERE "recipient" IN (SELECT "address" FROM gone);
      RETURN NULL;
    END $body$$f$, s);
  EXECUTE format($f$
    CREATE OR REPLACE FUNCTION %1$I."parley_messages_deleted"() RETURNS trigger LANGUAGE plpgsql
      SECURITY DEFINER SET search_path = %1$I, pg_temp AS $body$
    BEGIN
      DELETE FROM %1$I."deliveries" WHERE "message_id" IN (SELECT "id" FROM gone);
      RETURN NULL;
    END $body$$f$, s);
  EXECUTE format($f$
    CREATE OR REPLACE FUNCTION %1$I."parley_users_truncated"() RETURNS trigger LANGUAGE plpgsql
      SECURITY DEFINER SET search_path = %1$I, pg_temp AS $body$
    BEGIN
      TRUNCATE %1$I."events", %1$I."deliveries";
      RETURN NULL;
    END $body$$f$, s);
  EXECUTE format($f$
    CREATE OR REPLACE FUNCTION %1$I."parley_messages_truncated"() RETURNS trigger LANGUAGE plpgsql
      SECURITY DEFINER SET search_path = %1$I, pg_temp AS $body$
    BEGIN
      TRUNCATE %1$I."deliveries";
      RETURN NULL;
    END $body$$f$, s);
  -- Not a definer's and reads no table, but resolved the same way for one rule across them all.
  EXECUTE format($f$
    ALTER FUNCTION %1$I."parley_key_fixed"() SET search_path = %1$I, pg_temp$f$, s);
END
$migration$;
