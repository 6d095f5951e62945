-- Back to migration 010: the versions go.
DROP FUNCTION /* TEMPLATE: schema */atomicphase_record(text, text, text, bytea, text, text, bytea, bigint, integer, bigint, text);
DROP FUNCTION /* TEMPLATE: schema */atomicphase_admit(text, text, text, bytea, text, text, bytea, bigint, bigint, integer, text);
DROP TABLE /* TEMPLATE: schema */atomicphase_workflow_versions;
ALTER TABLE /* TEMPLATE: schema */idempotency_keys DROP COLUMN workflow_version;
