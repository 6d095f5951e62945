-- Back to migration 014: migration 004's indexes of due and unfinished keys
-- and of finished keys' age.
CREATE INDEX IF NOT EXISTS idempotency_keys_due_idx ON /* TEMPLATE: schema */idempotency_keys (next_attempt_at NULLS FIRST)
    WHERE response_status IS NULL AND parked_at IS NULL;
CREATE INDEX IF NOT EXISTS idempotency_keys_unfinished_scope_idx ON /* TEMPLATE: schema */idempotency_keys (scope)
    WHERE response_status IS NULL AND parked_at IS NULL;
CREATE INDEX IF NOT EXISTS idempotency_keys_finished_at_idx ON /* TEMPLATE: schema */idempotency_keys (finished_at)
    WHERE response_status IS NOT NULL;
DROP INDEX IF EXISTS /* TEMPLATE: schema */idempotency_keys_unfinished_idx;
