ALTER TABLE "webhooks" ADD COLUMN "key_id" text;--> statement-breakpoint
ALTER TABLE "webhooks" ADD CONSTRAINT "webhooks_key_id_api_keys_id_fk" FOREIGN KEY ("key_id") REFERENCES "public"."api_keys"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
CREATE INDEX "webhooks_key_idx" ON "webhooks" USING btree ("key_id");