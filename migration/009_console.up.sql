-- The console pages through the unfinished keys in the order (created_at,
-- scope, key), after a cursor (keyset pagination): this partial index makes
-- each page one range scan of the unfinished keys, however many finished
-- ones the table holds. Migrations run in a transaction, so it is built
-- without CONCURRENTLY; on a large table, build it first yourself with
--   CREATE INDEX CONCURRENTLY idempotency_keys_unfinished_created_idx
--       ON idempotency_keys (created_at, scope, idempotency_key)
--       WHERE response_status IS NULL;
-- and this migration finds it there.
CREATE INDEX IF NOT EXISTS idempotency_keys_unfinished_created_idx
    ON /* TEMPLATE: schema */idempotency_keys (created_at, scope, idempotency_key)
    WHERE response_status IS NULL;
