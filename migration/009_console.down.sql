-- Back to migration 006 (the console's index only).
DROP INDEX IF EXISTS /* TEMPLATE: schema */idempotency_keys_unfinished_created_idx;
