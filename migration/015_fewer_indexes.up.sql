-- atomicphase:no-transaction
-- Fewer index entries per request (migration 015). A new key's row entered
-- four indexes (the primary key, created_at, and the partial due and
-- unfinished_scope indexes), and the response's checkpoint, which cannot be
-- a HOT update (it moves the row out of the unfinished keys' indexes),
-- three more (the primary key, created_at and finished_at): seven index
-- insertions per request, about 70 bytes of WAL and an index descent each.
--
-- One partial index of unfinished keys, on (scope, next_attempt_at), now
-- serves both the per-scope count (a range of one scope) and the sweep,
-- which reads every unfinished key's entry in (scope, next_attempt_at)
-- order, the order its fairness window numbers them in. The reap of old
-- finished keys walks the created_at index instead of one on finished_at
-- (a key finishes after it is created, so every key that finished before
-- the cut-off was created before it). Five insertions per request instead
-- of seven.
--
-- Built and dropped concurrently, outside a transaction, so that no write
-- to the key table waits; the new index first, so that no query is left
-- without one.
CREATE INDEX CONCURRENTLY IF NOT EXISTS idempotency_keys_unfinished_idx
    ON /* TEMPLATE: schema */idempotency_keys (scope, next_attempt_at NULLS FIRST)
    WHERE response_status IS NULL AND parked_at IS NULL;
DROP INDEX CONCURRENTLY IF EXISTS /* TEMPLATE: schema */idempotency_keys_unfinished_scope_idx;
DROP INDEX CONCURRENTLY IF EXISTS /* TEMPLATE: schema */idempotency_keys_due_idx;
DROP INDEX CONCURRENTLY IF EXISTS /* TEMPLATE: schema */idempotency_keys_finished_at_idx;
