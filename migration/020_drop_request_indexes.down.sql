-- Back to migration 017: the indexes the previous release reads.
CREATE INDEX IF NOT EXISTS idempotency_keys_due_idx ON /* TEMPLATE: schema */idempotency_keys (next_attempt_at NULLS FIRST)
    WHERE response_status IS NULL AND parked_at IS NULL;
CREATE INDEX IF NOT EXISTS idempotency_keys_unfinished_scope_idx ON /* TEMPLATE: schema */idempotency_keys (scope)
    WHERE response_status IS NULL AND parked_at IS NULL;
CREATE INDEX IF NOT EXISTS idempotency_keys_finished_at_idx ON /* TEMPLATE: schema */idempotency_keys (finished_at)
    WHERE response_status IS NOT NULL;
CREATE INDEX IF NOT EXISTS idempotency_keys_parked_scope_idx ON /* TEMPLATE: schema */idempotency_keys (scope)
    WHERE response_status IS NULL AND parked_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS idempotency_keys_parked_at_idx ON /* TEMPLATE: schema */idempotency_keys (parked_at)
    WHERE response_status IS NULL AND parked_at IS NOT NULL;
