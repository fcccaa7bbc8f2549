CREATE TABLE "attachment_chunks" (
	"upload_id" text NOT NULL,
	"seq" integer NOT NULL,
	"message_id" text,
	"staged_at" timestamp (3) with time zone DEFAULT now() NOT NULL,
	"data" "bytea" NOT NULL,
	CONSTRAINT "attachment_chunks_upload_id_seq_pk" PRIMARY KEY("upload_id","seq")
);
--> statement-breakpoint
ALTER TABLE "attachments" ALTER COLUMN "data" DROP NOT NULL;--> statement-breakpoint
ALTER TABLE "attachments" ADD COLUMN "upload_id" text;--> statement-breakpoint
-- Existing files move into 256 KiB chunks (CHUNK_BYTES in attachment-store.ts), already claimed.
UPDATE "attachments" SET "upload_id" = 'upl_legacy_' || "message_id" || '_' || "n";--> statement-breakpoint
ALTER TABLE "attachments" ALTER COLUMN "upload_id" SET NOT NULL;--> statement-breakpoint
ALTER TABLE "attachment_chunks" ADD CONSTRAINT "attachment_chunks_message_id_messages_id_fk" FOREIGN KEY ("message_id") REFERENCES "public"."messages"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
CREATE INDEX "attachment_chunks_message_idx" ON "attachment_chunks" USING btree ("message_id");--> statement-breakpoint
CREATE INDEX "attachment_chunks_unclaimed_idx" ON "attachment_chunks" USING btree ("staged_at") WHERE message_id IS NULL;--> statement-breakpoint
INSERT INTO "attachment_chunks" ("upload_id", "seq", "message_id", "data")
SELECT a."upload_id", s.i, a."message_id", substring(a."data" FROM s.i * 262144 + 1 FOR 262144)
FROM "attachments" a, generate_series(0, greatest(0, (length(a."data") - 1) / 262144)) AS s(i)
WHERE a."data" IS NOT NULL AND length(a."data") > 0;
