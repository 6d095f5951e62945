-- Workflow versions (migration 011). Each key records the version of the
-- workflow definition it started under, so that it resumes under that
-- definition; processes record the versions they run, so that a key whose
-- version no deployed process runs is parked instead of retaken, and an
-- operator can tell when an old version is drained. Expand only: a column,
-- a table and new overloads; the functions a running previous release calls
-- are left as they were, and its keys have no version (NULL: they resume
-- under whichever definition has their recovery point, as before).

-- The version is set by the new overloads below for the statement's
-- transaction (set_config(..., true), cleared again once the inner call
-- returned), and taken by the key's INSERT as the column's default: the row is written once, by the statement that records
-- it, whichever function inserts it. A previous release sets nothing, and
-- its keys get NULL.
ALTER TABLE /* TEMPLATE: schema */idempotency_keys ADD COLUMN workflow_version text;
ALTER TABLE /* TEMPLATE: schema */idempotency_keys
    ALTER COLUMN workflow_version SET DEFAULT nullif(current_setting('atomicphase.workflow_version', true), '');

-- The versions processes run: each Runner records the (workflow, version)
-- pairs it registered, with their phases, and refreshes seen_at as its
-- sweep runs. A version not seen within a horizon is not deployed.
-- shape is the version derived from the phase list, whether or not the
-- version was declared: two processes that declare one version with
-- different phase lists are refused.
CREATE TABLE /* TEMPLATE: schema */atomicphase_workflow_versions (
    workflow      text        NOT NULL,
    version       text        NOT NULL,
    shape         text        NOT NULL,
    phases        text[]      NOT NULL,
    registered_at timestamptz NOT NULL DEFAULT now(),
    seen_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workflow, version)
);

-- atomicphase_admit with the request's workflow version: a new key records
-- it; the key's own version is returned (workflow_version), so the caller
-- runs the key under its definition.
CREATE FUNCTION /* TEMPLATE: schema */atomicphase_admit(
    p_scope text, p_key text, p_workflow text, p_fingerprint bytea,
    p_method text, p_path text, p_state bytea, p_lock_timeout_us bigint,
    p_lock_token bigint, p_max_unfinished integer, p_version text,
    OUT acquired boolean, OUT workflow text, OUT fingerprint bytea,
    OUT recovery_point text, OUT next_phase text, OUT state bytea,
    OUT lock_token bigint, OUT lock_expires_in float8, OUT downstream_salt uuid,
    OUT attempts integer, OUT took_over boolean, OUT over_limit boolean,
    OUT response_status integer, OUT response_header jsonb, OUT response_body bytea,
    OUT parked boolean, OUT workflow_version text
) LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('atomicphase.workflow_version', coalesce(p_version, ''), true);
    SELECT a.acquired, a.workflow, a.fingerprint, a.recovery_point, a.next_phase, a.state,
           a.lock_token, a.lock_expires_in, a.downstream_salt, a.attempts, a.took_over,
           a.over_limit, a.response_status, a.response_header, a.response_body, a.parked
    INTO acquired, workflow, fingerprint, recovery_point, next_phase, state,
         lock_token, lock_expires_in, downstream_salt, attempts, took_over,
         over_limit, response_status, response_header, response_body, parked
    FROM /* TEMPLATE: schema */atomicphase_admit(
        p_scope, p_key, p_workflow, p_fingerprint, p_method, p_path, p_state,
        p_lock_timeout_us, p_lock_token, p_max_unfinished) AS a;
    PERFORM set_config('atomicphase.workflow_version', '', true);
    IF acquired THEN
        SELECT k.workflow_version INTO workflow_version
        FROM /* TEMPLATE: schema */idempotency_keys k
        WHERE k.scope = p_scope AND k.idempotency_key = p_key;
    END IF;
END
$$;

-- atomicphase_record with the workflow version the new key records.
CREATE FUNCTION /* TEMPLATE: schema */atomicphase_record(
    p_scope text, p_key text, p_workflow text, p_fingerprint bytea,
    p_method text, p_path text, p_state bytea, p_lock_token bigint,
    p_max_unfinished integer, p_lease_us bigint, p_version text
) RETURNS TABLE (downstream_salt uuid) LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('atomicphase.workflow_version', coalesce(p_version, ''), true);
    RETURN QUERY SELECT r.downstream_salt FROM /* TEMPLATE: schema */atomicphase_record(
        p_scope, p_key, p_workflow, p_fingerprint, p_method, p_path, p_state,
        p_lock_token, p_max_unfinished, p_lease_us) AS r;
    PERFORM set_config('atomicphase.workflow_version', '', true);
END
$$;
