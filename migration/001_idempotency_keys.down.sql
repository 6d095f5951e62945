DROP FUNCTION IF EXISTS atomicphase_acquire(text, text, text, bytea, text, text, jsonb, bigint);
DROP FUNCTION IF EXISTS atomicphase_checkpoint(text, text, bigint, text, text, jsonb, integer, jsonb, bytea);
DROP TABLE IF EXISTS idempotency_keys;
