-- Back to migration 019: a new key is claimed at the head of its first
-- unit and inserted at its commit.
DROP FUNCTION IF EXISTS /* TEMPLATE: schema */atomicphase_record_first(text, text, text, bytea, text, text, bigint, bigint, text, text, text, bytea, integer, jsonb, bytea);
