DROP INDEX "messages_search_idx";--> statement-breakpoint
CREATE INDEX "messages_search_idx" ON "messages" USING gin ("search_hashes") WITH (fastupdate=true,gin_pending_list_limit=256);--> statement-breakpoint
ALTER TABLE "messages" DROP COLUMN "search";