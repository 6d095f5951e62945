-- Back to migration 014: the nine-argument release and called_at go.

DROP FUNCTION IF EXISTS /* TEMPLATE: schema */atomicphase_release(
    text, text, bigint, text, bigint, boolean, boolean, boolean, boolean);

ALTER TABLE /* TEMPLATE: schema */idempotency_keys DROP COLUMN IF EXISTS called_at;
