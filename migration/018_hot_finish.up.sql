-- atomicphase:no-transaction
-- A request that succeeds first time writes two index entries (the primary
-- key and created_at) and finishes with a HOT update, once migration 018
-- drops the indexes whose predicates read response_status, or whose key is
-- finished_at (each made every finish write a new entry in it). Here, the
-- indexes that take their place: the sweep reads the keys that went wrong
-- (next_attempt_at set, migration 016; parked ones left out) and the
-- parked keys, each from a partial index whose predicate reads columns a
-- finish never changes; the reaper reads finished keys in creation order
-- (created_at). Built concurrently, outside a transaction, so that no
-- write to the key table waits; Migrate drops a build an interrupted run
-- left invalid and builds it again.
CREATE INDEX CONCURRENTLY IF NOT EXISTS idempotency_keys_waiting_idx ON /* TEMPLATE: schema */idempotency_keys (next_attempt_at)
    WHERE next_attempt_at IS NOT NULL AND parked_at IS NULL;
CREATE INDEX CONCURRENTLY IF NOT EXISTS idempotency_keys_parked_idx ON /* TEMPLATE: schema */idempotency_keys (parked_at)
    WHERE parked_at IS NOT NULL;
-- Room on each page for a key's finish to stay on it (a HOT update needs
-- its new version on the old one's page). It applies to pages written
-- from now on.
ALTER TABLE /* TEMPLATE: schema */idempotency_keys SET (fillfactor = 70);
