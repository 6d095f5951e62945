-- Back to migration 007: the functions 008 added go; the ones it left alone
-- serve the previous release as they did.
DROP FUNCTION /* TEMPLATE: schema */atomicphase_admit(text, text, text, bytea, text, text, bytea, bigint, bigint, integer, integer);
