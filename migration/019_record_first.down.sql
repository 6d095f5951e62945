-- Back to migration 019: a new key is claimed at the head of its first
-- unit and inserted at its commit.
DROP FUNCTION IF EXISTS /* TEMPLATE: schema */atomicphase_record_first(text, text, text, bytea, text, text, bigint, bigint, text, text, text, bytea, integer, jsonb, bytea);
DROP TABLE IF EXISTS /* TEMPLATE: schema */atomicphase_releases;
ALTER TABLE /* TEMPLATE: schema */atomicphase_workflow_versions DROP COLUMN IF EXISTS current_seen_at;
ALTER TABLE /* TEMPLATE: schema */atomicphase_workflow_versions DROP COLUMN IF EXISTS older_seen_at;
