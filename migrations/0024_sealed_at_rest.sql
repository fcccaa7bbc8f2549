ALTER TABLE "attachment_chunks" ADD COLUMN "sealed_by" text;--> statement-breakpoint
ALTER TABLE "attachments" ADD COLUMN "sealed_by" text;--> statement-breakpoint
ALTER TABLE "messages" ADD COLUMN "sealed_by" text;--> statement-breakpoint
ALTER TABLE "messages" ADD COLUMN "search_hashes" integer[] DEFAULT '{}'::integer[] NOT NULL;--> statement-breakpoint
ALTER TABLE "idempotency_keys" ADD COLUMN "sealed_by" text;--> statement-breakpoint
ALTER TABLE "events" ADD COLUMN "sealed_by" text;--> statement-breakpoint
ALTER TABLE "metadata" ADD COLUMN "sealed_by" text;