ALTER TABLE "groups" ADD COLUMN "retention_days" integer;--> statement-breakpoint
CREATE INDEX "messages_age_idx" ON "messages" USING btree ((created_at AT TIME ZONE 'UTC'));--> statement-breakpoint
CREATE INDEX "groups_retention_idx" ON "groups" USING btree ("id") WHERE retention_days IS NOT NULL;