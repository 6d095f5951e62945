-- A new key's recording in one statement, at the head of its first
-- unit's batch when that unit goes whole (every statement queued, one
-- implicit transaction): the claim's advisory lock and the key's INSERT
-- with the unit's checkpoint, together. The unit's own statements come
-- after it, so they never run for a key that exists, and a duplicate of a
-- key being recorded is refused at once (AP002), as the claim refuses it:
-- one statement fewer per new key; on Citus, where it runs on the worker
-- that holds the key's shard, with that node's clock and transaction id.
-- Expand only: a new function. A release that does not know it claims and
-- records as before, with the same lock.
CREATE FUNCTION /* TEMPLATE: schema */atomicphase_record_first(
    p_scope text, p_key text, p_workflow text, p_fingerprint bytea,
    p_method text, p_path text, p_lock_token bigint, p_lease_us bigint, p_version text,
    p_recovery_point text, p_next_phase text, p_state bytea,
    p_status integer, p_header jsonb, p_body bytea
) RETURNS TABLE (downstream_salt uuid) LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz;
BEGIN
    -- The transaction's id before the key's times: a sweep that plans its
    -- watermark after created_at was read waits for this transaction,
    -- which now runs the whole unit after it (atomicphase_record_unit
    -- runs last, after the unit's statements took an id).
    PERFORM txid_current();
    v_now := clock_timestamp();
    IF NOT pg_try_advisory_xact_lock(hashtextextended(p_scope || chr(31) || p_key, 7::bigint)) THEN
        RAISE EXCEPTION 'idempotency key % is being recorded by another request', p_key
            USING ERRCODE = 'AP002';
    END IF;
    -- As atomicphase_record_unit: the row as the checkpoint leaves it,
    -- written once; AP003 when the key exists. Written out rather than
    -- called: a nested call of atomicphase_record_unit cost about 6 µs of
    -- this statement's 60 (server CPU, pgbench, 8 rounds).
    INSERT INTO /* TEMPLATE: schema */idempotency_keys AS k
        (scope, idempotency_key, workflow, fingerprint, request_method, request_path,
         state, lock_token, locked_at, created_at, updated_at, lease_us, workflow_version,
         recovery_point, next_phase, response_status, response_header, response_body, finished_at, status)
    VALUES (p_scope, p_key, p_workflow, p_fingerprint, p_method, p_path,
            p_state, p_lock_token, CASE WHEN p_status IS NULL THEN v_now END, v_now, v_now, p_lease_us, p_version,
            p_recovery_point, p_next_phase, p_status, p_header, p_body,
            CASE WHEN p_status IS NOT NULL THEN v_now END, CASE WHEN p_status IS NULL THEN 'r' ELSE 'f' END)
    ON CONFLICT (scope, idempotency_key) DO NOTHING
    RETURNING k.downstream_salt INTO downstream_salt;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'idempotency key % was recorded by another request meanwhile', p_key
            USING ERRCODE = 'AP003';
    END IF;
    RETURN NEXT;
END
$$;

-- Which releases are live, for the contract steps (a migration marked
-- atomicphase:contract) that remove what an older release reads: they
-- refuse while one may still run. From this release on, each process
-- records on every announcement the migration its release needs
-- (MinVersion) in atomicphase_releases. An older release records nothing
-- there, but it does announce its workflow versions, and its announcement
-- sets seen_at alone: a later release's sets current_seen_at to the same
-- time, and keeps in older_seen_at a seen_at it finds that differs.
-- Expand only: a table and two columns a previous release never reads.
CREATE TABLE /* TEMPLATE: schema */atomicphase_releases (
    needs   integer     PRIMARY KEY,
    seen_at timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE /* TEMPLATE: schema */atomicphase_workflow_versions ADD COLUMN current_seen_at timestamptz;
ALTER TABLE /* TEMPLATE: schema */atomicphase_workflow_versions ADD COLUMN older_seen_at timestamptz;

-- A role that runs requests already (a previous release's, granted the
-- key table and the versions table) gets what this release's processes
-- write besides: the sweep's watermark (migration 016) with UPDATE on the
-- key table, the releases table with INSERT on the versions table. A role
-- granted them later needs them too (docs/security-and-limits.md,
-- "Database roles"). Every name and operator qualified, as in 017.
DO $$
DECLARE
    v_grant record;
BEGIN
    FOR v_grant IN
        SELECT DISTINCT x.target, CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0::pg_catalog.oid THEN 'PUBLIC'
                                       ELSE pg_catalog.quote_ident(r.rolname::pg_catalog.text) END AS grantee
        FROM (VALUES (pg_catalog.pg_typeof(NULL::/* TEMPLATE: schema */idempotency_keys), 'UPDATE',
                      pg_catalog.pg_typeof(NULL::/* TEMPLATE: schema */atomicphase_sweep_watermark)),
                     (pg_catalog.pg_typeof(NULL::/* TEMPLATE: schema */atomicphase_workflow_versions), 'INSERT',
                      pg_catalog.pg_typeof(NULL::/* TEMPLATE: schema */atomicphase_releases)))
             AS x0(source_type, privilege, target_type),
             LATERAL (SELECT (SELECT t.typrelid FROM pg_catalog.pg_type t WHERE t.oid OPERATOR(pg_catalog.=) x0.source_type::pg_catalog.oid) AS source,
                             (SELECT t.typrelid::pg_catalog.regclass FROM pg_catalog.pg_type t WHERE t.oid OPERATOR(pg_catalog.=) x0.target_type::pg_catalog.oid) AS target) AS x,
             pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
        LEFT JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) a.grantee
        WHERE c.oid OPERATOR(pg_catalog.=) x.source
          AND a.privilege_type OPERATOR(pg_catalog.=) x0.privilege
          AND a.grantee OPERATOR(pg_catalog.<>) c.relowner
    LOOP
        EXECUTE pg_catalog.format('GRANT SELECT, INSERT, UPDATE ON %s TO %s', v_grant.target, v_grant.grantee);
    END LOOP;
END
$$;

-- What each table, column and function is for, in the catalog (\d+ and \df+
-- in psql show it) and in schema.sql, which is written from the catalog.
COMMENT ON TABLE /* TEMPLATE: schema */idempotency_keys IS 'One row per (scope, idempotency key): the request it was first sent with, where its workflow stands, who holds it, and once finished the response every retry gets.';
COMMENT ON COLUMN /* TEMPLATE: schema */idempotency_keys.scope IS 'Whose key it is (a user, an account): keys are unique within a scope only.';
COMMENT ON COLUMN /* TEMPLATE: schema */idempotency_keys.idempotency_key IS 'The key the client sent.';
COMMENT ON COLUMN /* TEMPLATE: schema */idempotency_keys.workflow IS 'The workflow that runs the request.';
COMMENT ON COLUMN /* TEMPLATE: schema */idempotency_keys.fingerprint IS 'A hash of the request (method, path, body, parameters): a retry must match it, or the key is being reused.';
COMMENT ON COLUMN /* TEMPLATE: schema */idempotency_keys.request_method IS 'The first request''s HTTP method, for operators.';
COMMENT ON COLUMN /* TEMPLATE: schema */idempotency_keys.request_path IS 'The first request''s path and query, for operators.';
COMMENT ON COLUMN /* TEMPLATE: schema */idempotency_keys.recovery_point IS 'The last phase committed (started before any; finished at the end): a retry resumes after it.';
COMMENT ON COLUMN /* TEMPLATE: schema */idempotency_keys.next_phase IS 'Set when the last committed phase jumped: the phase to run next.';
COMMENT ON COLUMN /* TEMPLATE: schema */idempotency_keys.state IS 'The workflow''s state after the last committed phase, as bytes (JSON by default).';
COMMENT ON COLUMN /* TEMPLATE: schema */idempotency_keys.lock_token IS 'The token of the attempt that last took the key: every write of a running key names it (fencing).';
COMMENT ON COLUMN /* TEMPLATE: schema */idempotency_keys.locked_at IS 'A running key''s lease start, renewed by each phase commit; NULL when nobody holds the key.';
COMMENT ON COLUMN /* TEMPLATE: schema */idempotency_keys.response_status IS 'A finished key''s HTTP status.';
COMMENT ON COLUMN /* TEMPLATE: schema */idempotency_keys.response_header IS 'A finished key''s replayable response headers.';
COMMENT ON COLUMN /* TEMPLATE: schema */idempotency_keys.response_body IS 'A finished key''s response body, replayed byte for byte.';
COMMENT ON COLUMN /* TEMPLATE: schema */idempotency_keys.created_at IS 'When the key was recorded: the sweep and the reapers find keys by it.';
COMMENT ON COLUMN /* TEMPLATE: schema */idempotency_keys.updated_at IS 'When the key last changed.';
COMMENT ON COLUMN /* TEMPLATE: schema */idempotency_keys.finished_at IS 'When the key finished.';
COMMENT ON COLUMN /* TEMPLATE: schema */idempotency_keys.downstream_salt IS 'Mixed into the keys sent to downstream APIs, so that a key forgotten and sent again is not taken for the old one there.';
COMMENT ON COLUMN /* TEMPLATE: schema */idempotency_keys.parked_at IS 'A parked key''s: when it was parked.';
COMMENT ON COLUMN /* TEMPLATE: schema */idempotency_keys.last_error IS 'The last attempt''s error, as Config.RedactError left it.';
COMMENT ON COLUMN /* TEMPLATE: schema */idempotency_keys.attempts IS 'How many attempts took the key (the budget is Config.MaxAttempts).';
COMMENT ON COLUMN /* TEMPLATE: schema */idempotency_keys.next_attempt_at IS 'A waiting or unknown key''s: when its backoff ends and the sweep may resume it.';
COMMENT ON COLUMN /* TEMPLATE: schema */idempotency_keys.unknown_at IS 'An unknown key''s: when the foreign call''s outcome became unknown.';
COMMENT ON COLUMN /* TEMPLATE: schema */idempotency_keys.resolved_after IS 'The phase whose unknown outcome a verdict settled.';
COMMENT ON COLUMN /* TEMPLATE: schema */idempotency_keys.resolved_happened IS 'A verdict: whether the foreign call happened.';
COMMENT ON COLUMN /* TEMPLATE: schema */idempotency_keys.resolved_note IS 'A verdict''s note: who settled the outcome and how.';
COMMENT ON COLUMN /* TEMPLATE: schema */idempotency_keys.resolved_at IS 'When a verdict settled the outcome.';
COMMENT ON COLUMN /* TEMPLATE: schema */idempotency_keys.lease_us IS 'A running key''s lease, in microseconds from locked_at.';
COMMENT ON COLUMN /* TEMPLATE: schema */idempotency_keys.call_until IS 'The end of a foreign call''s quiet period: until then nobody takes the key, so a slow call is never repeated.';
COMMENT ON COLUMN /* TEMPLATE: schema */idempotency_keys.final_parked_at IS 'Set when the key was parked for good (a permanent failure, a panic): a verdict leaves it parked.';
COMMENT ON COLUMN /* TEMPLATE: schema */idempotency_keys.resolved_result IS 'A verdict''s result (what the downstream said), as JSON.';
COMMENT ON COLUMN /* TEMPLATE: schema */idempotency_keys.workflow_version IS 'The workflow version the key runs under.';
COMMENT ON COLUMN /* TEMPLATE: schema */idempotency_keys.called_at IS 'When a foreign phase of the key last began its call: a key that may have paid.';
COMMENT ON COLUMN /* TEMPLATE: schema */idempotency_keys.status IS 'The key''s state, the one truth: r running, w waiting, u unknown, p parked, f finished. Every write names the states it may move a key from.';

COMMENT ON TABLE /* TEMPLATE: schema */atomicphase_key_history IS 'What happened to a key off the happy path, one row per event (failed, parked, resumed, unknown, settled…); a key keeps its newest 1000.';
COMMENT ON COLUMN /* TEMPLATE: schema */atomicphase_key_history.scope IS 'The key''s scope.';
COMMENT ON COLUMN /* TEMPLATE: schema */atomicphase_key_history.idempotency_key IS 'The key.';
COMMENT ON COLUMN /* TEMPLATE: schema */atomicphase_key_history.id IS 'The event''s order.';
COMMENT ON COLUMN /* TEMPLATE: schema */atomicphase_key_history.at IS 'When it happened.';
COMMENT ON COLUMN /* TEMPLATE: schema */atomicphase_key_history.event IS 'What happened.';
COMMENT ON COLUMN /* TEMPLATE: schema */atomicphase_key_history.status_before IS 'The key''s state before, by name.';
COMMENT ON COLUMN /* TEMPLATE: schema */atomicphase_key_history.status IS 'The key''s state after, by name.';
COMMENT ON COLUMN /* TEMPLATE: schema */atomicphase_key_history.recovery_point IS 'The key''s recovery point then.';
COMMENT ON COLUMN /* TEMPLATE: schema */atomicphase_key_history.attempt IS 'The attempt it happened in.';
COMMENT ON COLUMN /* TEMPLATE: schema */atomicphase_key_history.lock_token IS 'The token of the attempt that held the key.';
COMMENT ON COLUMN /* TEMPLATE: schema */atomicphase_key_history.error IS 'The error, if any, as redacted; cleared when the key finishes.';

COMMENT ON TABLE /* TEMPLATE: schema */atomicphase_audit IS 'What operators did to keys (unpark, verdict, forget…), by whom and why.';
COMMENT ON COLUMN /* TEMPLATE: schema */atomicphase_audit.scope IS 'The key''s scope.';
COMMENT ON COLUMN /* TEMPLATE: schema */atomicphase_audit.idempotency_key IS 'The key.';
COMMENT ON COLUMN /* TEMPLATE: schema */atomicphase_audit.id IS 'The entry''s order.';
COMMENT ON COLUMN /* TEMPLATE: schema */atomicphase_audit.at IS 'When it was done.';
COMMENT ON COLUMN /* TEMPLATE: schema */atomicphase_audit.actor IS 'Who did it.';
COMMENT ON COLUMN /* TEMPLATE: schema */atomicphase_audit.action IS 'What was done.';
COMMENT ON COLUMN /* TEMPLATE: schema */atomicphase_audit.note IS 'Why, in the operator''s words.';
COMMENT ON COLUMN /* TEMPLATE: schema */atomicphase_audit.detail IS 'What the action saw or changed, as JSON.';

COMMENT ON TABLE /* TEMPLATE: schema */atomicphase_workflow_versions IS 'Every workflow version a process registered: a key names the version it runs under, and the console shows its phases.';
COMMENT ON COLUMN /* TEMPLATE: schema */atomicphase_workflow_versions.workflow IS 'The workflow.';
COMMENT ON COLUMN /* TEMPLATE: schema */atomicphase_workflow_versions.version IS 'Its version.';
COMMENT ON COLUMN /* TEMPLATE: schema */atomicphase_workflow_versions.shape IS 'A hash of its phases: a version''s shape never changes.';
COMMENT ON COLUMN /* TEMPLATE: schema */atomicphase_workflow_versions.phases IS 'Its phases, in order.';
COMMENT ON COLUMN /* TEMPLATE: schema */atomicphase_workflow_versions.registered_at IS 'When it was first registered.';
COMMENT ON COLUMN /* TEMPLATE: schema */atomicphase_workflow_versions.seen_at IS 'When a live process last said it runs it.';

COMMENT ON COLUMN /* TEMPLATE: schema */atomicphase_workflow_versions.current_seen_at IS 'When a process of a release that records its release (0.3.0 or later) last said it runs it; NULL if none has.';
COMMENT ON COLUMN /* TEMPLATE: schema */atomicphase_workflow_versions.older_seen_at IS 'The last time a process of an older release (one that does not record its release) was seen to say it runs it; NULL if never.';
COMMENT ON TABLE /* TEMPLATE: schema */atomicphase_releases IS 'The releases live processes run, by the migration each needs: a contract step refuses while a process whose release needs an older schema was seen recently.';
COMMENT ON COLUMN /* TEMPLATE: schema */atomicphase_releases.needs IS 'The migration the release needs the database to have reached (MinVersion).';
COMMENT ON COLUMN /* TEMPLATE: schema */atomicphase_releases.seen_at IS 'When a process of such a release last announced itself.';
COMMENT ON TABLE /* TEMPLATE: schema */atomicphase_sweep_watermark IS 'How far the sweep has looked through keys by creation time, so that it reads only the keys created since.';
COMMENT ON COLUMN /* TEMPLATE: schema */atomicphase_sweep_watermark.name IS 'The watermark''s name.';
COMMENT ON COLUMN /* TEMPLATE: schema */atomicphase_sweep_watermark.created_before IS 'Every key created before this has been looked at.';
COMMENT ON COLUMN /* TEMPLATE: schema */atomicphase_sweep_watermark.pending_before IS 'The next watermark, once the transactions in flight when it was read have ended.';
COMMENT ON COLUMN /* TEMPLATE: schema */atomicphase_sweep_watermark.pending_xmax IS 'The transactions that must end before pending_before holds.';
COMMENT ON COLUMN /* TEMPLATE: schema */atomicphase_sweep_watermark.pending_nodes IS 'On Citus, the same per worker node.';

COMMENT ON TABLE /* TEMPLATE: schema */atomicphase_migration IS 'The migrations applied to this schema (Migrate).';
COMMENT ON COLUMN /* TEMPLATE: schema */atomicphase_migration.version IS 'The migration''s number.';
COMMENT ON COLUMN /* TEMPLATE: schema */atomicphase_migration.name IS 'Its name.';
COMMENT ON COLUMN /* TEMPLATE: schema */atomicphase_migration.applied_at IS 'When it was applied.';

-- Each function, every overload of its name.
DO $$
DECLARE
    v_ns oid := (SELECT relnamespace FROM pg_catalog.pg_class WHERE oid OPERATOR(pg_catalog.=) '/* TEMPLATE: schema */idempotency_keys'::pg_catalog.regclass);
    v record;
BEGIN
    FOR v IN
        SELECT p.oid::pg_catalog.regprocedure AS fn, c.text
        FROM (VALUES
            ('atomicphase_acquire', 'Decides an arriving request in one statement (a previous release''s way in): records a new key, replays a finished one, refuses one held or reused, or takes one nobody holds.'),
            ('atomicphase_admit', 'atomicphase_acquire with the workflow version and parking told apart: a request''s way in for a workflow that begins with a foreign phase or a scope with a cap on unfinished keys.'),
            ('atomicphase_checkpoint', 'Commits a phase''s recovery point and state (and, at the end, the response) for the attempt that holds the key; raises when the key is no longer its.'),
            ('atomicphase_claim', 'Takes the transaction''s advisory lock on a new key before it is recorded, raising AP002 when another transaction holds it and AP003 when the key exists.'),
            ('atomicphase_held_until', 'When a key stops being held: the end of its lease or of a foreign call''s quiet period, whichever is later.'),
            ('atomicphase_key_delete', 'The DELETE guard: refuses to delete a key that is unfinished or whose history matters, unless the transaction forgets it on purpose (atomicphase.forget_forced), and deletes its history with it.'),
            ('atomicphase_key_event', 'Writes one event into a key''s history, keeping its newest 1000.'),
            ('atomicphase_key_table_fired', 'Whether a trigger fired for the key table (or one of its shards): the DELETE guard checks it before reading a row.'),
            ('atomicphase_lock_expires', 'How long until a key may be taken, from its lease and quiet period.'),
            ('atomicphase_lock_takeable', 'Whether a lock taken at a time is stale by a cutoff (a previous release''s rule).'),
            ('atomicphase_record', 'Records a new key on its own (a previous release''s way, and the way for a scope with a cap on unfinished keys).'),
            ('atomicphase_record_first', 'Records a new key with its first unit''s checkpoint, at the head of that unit''s batch, where a plain statement cannot (Citus).'),
            ('atomicphase_record_resolution', 'Records a verdict on an unknown outcome (a previous release''s RecordResolution).'),
            ('atomicphase_record_unit', 'Records a new key at its first unit''s commit (a previous release''s way).'),
            ('atomicphase_record_verdict', 'Records a verdict on an unknown outcome with its result, and moves the key as the state table allows.'),
            ('atomicphase_refuse', 'Raises an error with a code: what a plain statement calls on the branch that refuses, so that its batch ends there.'),
            ('atomicphase_release', 'Lets go of a key after a failed attempt: waiting with a backoff, unknown, or parked, with the error in its history.'),
            ('atomicphase_renew', 'Renews a running key''s lease and marks its foreign call.'),
            ('atomicphase_schedule', 'Makes a key due now: an unparked key with a fresh budget of attempts, or another''s backoff cleared.'),
            ('atomicphase_stale_before', 'The cutoff before which a lock is stale (a previous release''s rule).'),
            ('atomicphase_state_name', 'A state''s name (running, waiting, unknown, parked, finished) from its letter.'),
            ('atomicphase_take', 'Takes a key nobody holds, for Resume, the sweep or a verdict''s resolution.'),
            ('atomicphase_unpark', 'Unparks a key (a previous release''s Unpark).')
        ) AS c(name, text)
        JOIN pg_catalog.pg_proc p ON p.proname OPERATOR(pg_catalog.=) c.name AND p.pronamespace OPERATOR(pg_catalog.=) v_ns
    LOOP
        EXECUTE pg_catalog.format('COMMENT ON FUNCTION %s IS %L', v.fn, v.text);
    END LOOP;
END $$;
