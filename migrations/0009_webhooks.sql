CREATE TABLE "webhook_deliveries" (
	"webhook_id" text NOT NULL,
	"event_id" bigint NOT NULL,
	"status" text NOT NULL,
	"attempts" integer DEFAULT 0 NOT NULL,
	"last_error" text,
	"last_attempt_at" timestamp (3) with time zone,
	"redeliver" timestamp (3) with time zone,
	CONSTRAINT "webhook_deliveries_webhook_id_event_id_pk" PRIMARY KEY("webhook_id","event_id")
);
--> statement-breakpoint
CREATE TABLE "webhooks" (
	"id" text PRIMARY KEY NOT NULL,
	"address" text NOT NULL,
	"url" text NOT NULL,
	"events" text[],
	"secret" text NOT NULL,
	"created_at" timestamp (3) with time zone DEFAULT now() NOT NULL,
	"disabled_at" timestamp (3) with time zone,
	"delivered_through" bigint NOT NULL,
	"next_attempt_at" timestamp (3) with time zone DEFAULT now() NOT NULL,
	"failing_since" timestamp (3) with time zone,
	"lease_until" timestamp (3) with time zone,
	"lease_token" text
);
--> statement-breakpoint
ALTER TABLE "webhook_deliveries" ADD CONSTRAINT "webhook_deliveries_webhook_id_webhooks_id_fk" FOREIGN KEY ("webhook_id") REFERENCES "public"."webhooks"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "webhooks" ADD CONSTRAINT "webhooks_address_users_address_fk" FOREIGN KEY ("address") REFERENCES "public"."users"("address") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
CREATE INDEX "webhook_deliveries_redeliver_idx" ON "webhook_deliveries" USING btree ("webhook_id","event_id") WHERE redeliver IS NOT NULL;--> statement-breakpoint
CREATE INDEX "webhooks_address_idx" ON "webhooks" USING btree ("address");--> statement-breakpoint
CREATE INDEX "webhooks_due_idx" ON "webhooks" USING btree ("next_attempt_at") WHERE disabled_at IS NULL;