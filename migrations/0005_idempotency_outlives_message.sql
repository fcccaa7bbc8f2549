ALTER TABLE "idempotency_keys" DROP CONSTRAINT "idempotency_keys_message_id_messages_id_fk";
