-- atomicphase:no-transaction
-- The contract step of migrations 016 and 017: the indexes every request
-- paid for go, concurrently (no write waits). The previous release's
-- sweep, console and scope cap read them: apply this migration once no
-- process of that release is left (MigrateOpts.TargetVersion 17 during the
-- rollout, docs/operations.md, "Upgrades"); before that, they work, each
-- reading the table instead.
DROP INDEX CONCURRENTLY IF EXISTS /* TEMPLATE: schema */idempotency_keys_due_idx;
DROP INDEX CONCURRENTLY IF EXISTS /* TEMPLATE: schema */idempotency_keys_unfinished_scope_idx;
DROP INDEX CONCURRENTLY IF EXISTS /* TEMPLATE: schema */idempotency_keys_finished_at_idx;
DROP INDEX CONCURRENTLY IF EXISTS /* TEMPLATE: schema */idempotency_keys_parked_scope_idx;
DROP INDEX CONCURRENTLY IF EXISTS /* TEMPLATE: schema */idempotency_keys_parked_at_idx;
