-- Back to migration 009: the indexes of parked keys go.
DROP INDEX IF EXISTS /* TEMPLATE: schema */idempotency_keys_parked_at_idx;
DROP INDEX IF EXISTS /* TEMPLATE: schema */idempotency_keys_parked_scope_idx;
