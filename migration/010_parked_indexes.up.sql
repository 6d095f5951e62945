-- atomicphase:no-transaction
-- The indexes of parked keys (migration 008): a scope's parked keys count
-- toward its cap on unfinished keys, and the sweep reaps parked keys past
-- their retention. Built concurrently, outside a transaction, so that no
-- write to the key table waits for the build; Migrate drops a build an
-- interrupted run left invalid and builds it again.
CREATE INDEX CONCURRENTLY IF NOT EXISTS idempotency_keys_parked_scope_idx ON /* TEMPLATE: schema */idempotency_keys (scope)
    WHERE response_status IS NULL AND parked_at IS NOT NULL;
CREATE INDEX CONCURRENTLY IF NOT EXISTS idempotency_keys_parked_at_idx ON /* TEMPLATE: schema */idempotency_keys (parked_at)
    WHERE response_status IS NULL AND parked_at IS NOT NULL;
