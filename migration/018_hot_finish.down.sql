-- Back to migration 016: no index of keys that went wrong or of parked
-- keys, and the default fillfactor.
DROP INDEX IF EXISTS /* TEMPLATE: schema */idempotency_keys_parked_idx;
DROP INDEX IF EXISTS /* TEMPLATE: schema */idempotency_keys_waiting_idx;
ALTER TABLE /* TEMPLATE: schema */idempotency_keys RESET (fillfactor);
