-- Back to migration 005: the Runner's statements of before write the key
-- table directly, with times taken by the node that runs each statement.
DROP FUNCTION /* TEMPLATE: schema */atomicphase_record_resolution(text, text, boolean, text, bigint);
DROP FUNCTION /* TEMPLATE: schema */atomicphase_unpark(text, text);
DROP FUNCTION /* TEMPLATE: schema */atomicphase_release(text, text, bigint, text, bigint, boolean, boolean);
DROP FUNCTION /* TEMPLATE: schema */atomicphase_take(text, text, bigint, bigint, boolean);
DROP FUNCTION /* TEMPLATE: schema */atomicphase_record(text, text, text, bytea, text, text, bytea, bigint, integer);
