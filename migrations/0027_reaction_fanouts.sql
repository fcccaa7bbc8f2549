CREATE TABLE "reaction_fanouts" (
	"id" bigint PRIMARY KEY GENERATED ALWAYS AS IDENTITY (sequence name "reaction_fanouts_id_seq" INCREMENT BY 1 MINVALUE 1 MAXVALUE 9223372036854775807 START WITH 1 CACHE 1),
	"message_id" text NOT NULL,
	"data" jsonb NOT NULL,
	"reactor" text NOT NULL,
	"told_through" text,
	"created_at" timestamp (3) with time zone DEFAULT now() NOT NULL
);
--> statement-breakpoint
ALTER TABLE "reaction_fanouts" ADD CONSTRAINT "reaction_fanouts_message_id_messages_id_fk" FOREIGN KEY ("message_id") REFERENCES "public"."messages"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
CREATE INDEX "reaction_fanouts_message_idx" ON "reaction_fanouts" USING btree ("message_id","id");