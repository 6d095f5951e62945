DROP FUNCTION IF EXISTS /* TEMPLATE: schema */atomicphase_acquire(text, text, text, bytea, text, text, jsonb, bigint);
DROP FUNCTION IF EXISTS /* TEMPLATE: schema */atomicphase_checkpoint(text, text, bigint, text, text, jsonb, integer, jsonb, bytea);
DROP TABLE IF EXISTS /* TEMPLATE: schema */idempotency_keys;
