CREATE TABLE "event_acks" (
	"key_id" text NOT NULL,
	"seq" bigint NOT NULL,
	CONSTRAINT "event_acks_key_id_seq_pk" PRIMARY KEY("key_id","seq")
);
--> statement-breakpoint
CREATE TABLE "key_feeds" (
	"key_id" text PRIMARY KEY NOT NULL,
	"acked_through" bigint DEFAULT 0 NOT NULL
);
--> statement-breakpoint
ALTER TABLE "event_acks" ADD CONSTRAINT "event_acks_key_id_api_keys_id_fk" FOREIGN KEY ("key_id") REFERENCES "public"."api_keys"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "key_feeds" ADD CONSTRAINT "key_feeds_key_id_api_keys_id_fk" FOREIGN KEY ("key_id") REFERENCES "public"."api_keys"("id") ON DELETE cascade ON UPDATE no action;