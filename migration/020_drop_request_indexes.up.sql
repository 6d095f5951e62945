-- atomicphase:no-transaction
-- atomicphase:contract needs=19
-- The contract step of migrations 016 and 017: the indexes every request
-- paid for go, concurrently (no write waits). The previous release's
-- sweep, console and scope cap read them: Migrate applies this migration
-- only when asked (MigrateOpts.Contract, atomicphase migrate --contract),
-- and refuses while a process of a release that needs a migration before
-- 019 (0.2.0 and older) may still run (docs/operations.md, "Upgrades");
-- such a process would still work, each reading the table instead.
DROP INDEX CONCURRENTLY IF EXISTS /* TEMPLATE: schema */idempotency_keys_due_idx;
DROP INDEX CONCURRENTLY IF EXISTS /* TEMPLATE: schema */idempotency_keys_unfinished_scope_idx;
DROP INDEX CONCURRENTLY IF EXISTS /* TEMPLATE: schema */idempotency_keys_finished_at_idx;
DROP INDEX CONCURRENTLY IF EXISTS /* TEMPLATE: schema */idempotency_keys_parked_scope_idx;
DROP INDEX CONCURRENTLY IF EXISTS /* TEMPLATE: schema */idempotency_keys_parked_at_idx;
