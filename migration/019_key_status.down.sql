-- On Citus, triggers of a distributed table are dropped with this set (a
-- setting of no effect elsewhere).
SET LOCAL citus.enable_unsafe_triggers = on;
DROP TRIGGER IF EXISTS atomicphase_key_delete ON /* TEMPLATE: schema */idempotency_keys;
DROP TRIGGER IF EXISTS atomicphase_key_status ON /* TEMPLATE: schema */idempotency_keys;
DROP FUNCTION IF EXISTS /* TEMPLATE: schema */atomicphase_key_delete();
DROP FUNCTION IF EXISTS /* TEMPLATE: schema */atomicphase_key_status();
DROP FUNCTION IF EXISTS /* TEMPLATE: schema */atomicphase_key_table_fired(oid);
DROP FUNCTION IF EXISTS /* TEMPLATE: schema */atomicphase_deletable(integer, timestamptz, timestamptz, timestamptz, timestamptz, timestamptz);
DROP FUNCTION IF EXISTS /* TEMPLATE: schema */atomicphase_status_may_change(text, text);
DROP FUNCTION IF EXISTS /* TEMPLATE: schema */atomicphase_status_of(integer, timestamptz, timestamptz, timestamptz);
DROP TABLE IF EXISTS /* TEMPLATE: schema */atomicphase_key_history;
ALTER TABLE /* TEMPLATE: schema */idempotency_keys DROP COLUMN IF EXISTS status;
