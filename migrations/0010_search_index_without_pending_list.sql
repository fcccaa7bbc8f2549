-- The same index without a pending list (fastupdate), altered in place rather than rebuilt, so a
-- large messages table is not locked for a rebuild. Entries already pending are merged now.
ALTER INDEX "messages_search_idx" SET (fastupdate = off);--> statement-breakpoint
SELECT gin_clean_pending_list('messages_search_idx'::regclass);
