ALTER TABLE "users" ADD COLUMN "erasure_requested_at" timestamp (3) with time zone;--> statement-breakpoint
ALTER TABLE "users" ADD COLUMN "erased_at" timestamp (3) with time zone;--> statement-breakpoint
CREATE INDEX "users_erasure_pending_idx" ON "users" USING btree ("erasure_requested_at") WHERE erasure_requested_at IS NOT NULL AND erased_at IS NULL;