-- The search index with a pending list again, but a small one (256 kB rather than the 4 MB
-- default that 0010 turned off): a new message's words are appended to the list and merged
-- into the index sorted, a few hundred messages at a time, which costs less per message than
-- inserting each word into its posting tree at once (a batch of 5 sends: 1.56 -> 1.38 ms, of
-- 20: 3.96 -> 3.23 ms), while a merge stays short (a few ms, where 4 MB took 80-200 ms).
-- Only the catalog changes, but under an exclusive lock on the index: behind a long search it
-- would hold every send queued behind it, so it gives up after 5 s (run `parley migrate` again).
SET LOCAL lock_timeout = '5s';--> statement-breakpoint
ALTER INDEX "messages_search_idx" SET (fastupdate = on, gin_pending_list_limit = 256);--> statement-breakpoint
SET LOCAL lock_timeout = DEFAULT;
