-- The test bot exists in every database (API.md §5). A deployment that sets TEST_BOT_ADDRESS
-- to another address gets that user created at start-up as well.
INSERT INTO "users" ("address", "display_name", "bot") VALUES ('testbot', 'Test bot', true)
ON CONFLICT ("address") DO UPDATE SET "bot" = true;
