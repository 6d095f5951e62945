-- The current atomicphase schema, as the numbered migrations in migration/
-- leave it, for projects that apply schema with their own migration tool.
-- Migrate applies the migrations one by one and records each; this file
-- makes the same tables, indexes, functions and comments at once (a test
-- compares the two databases object by object), and records the
-- migrations as applied, so that a later Migrate applies only newer ones.
-- It is written from the catalog of a migrated database by make schema.
--
-- It is in four parts: the tables, each followed by what its columns hold
-- and its indexes; the functions; the trigger; the migrations recorded.
-- On Citus, distribute the tables and functions after applying it
-- (atomicphase.CitusDistribution, or migrate --citus).

-- Tables

-- One row per (scope, idempotency key): the request it was first sent with,
-- where its workflow stands, who holds it, and once finished the response
-- every retry gets.
CREATE TABLE idempotency_keys (
    -- Whose key it is (a user, an account): keys are unique within a scope
    -- only.
    scope text NOT NULL,
    -- The key the client sent.
    idempotency_key text NOT NULL,
    -- The workflow that runs the request.
    workflow text NOT NULL,
    -- A hash of the request (method, path, body, parameters): a retry must
    -- match it, or the key is being reused.
    fingerprint bytea NOT NULL,
    -- The first request's HTTP method, for operators.
    request_method text NOT NULL,
    -- The first request's path and query, for operators.
    request_path text NOT NULL,
    -- The last phase committed (started before any; finished at the end): a
    -- retry resumes after it.
    recovery_point text NOT NULL DEFAULT 'started'::text,
    -- Set when the last committed phase jumped: the phase to run next.
    next_phase text,
    -- The workflow's state after the last committed phase, as bytes (JSON by
    -- default).
    state bytea,
    -- The token of the attempt that last took the key: every write of a
    -- running key names it (fencing).
    lock_token bigint NOT NULL DEFAULT 1,
    -- A running key's lease start, renewed by each phase commit; NULL when
    -- nobody holds the key.
    locked_at timestamp with time zone,
    -- A finished key's HTTP status.
    response_status integer,
    -- A finished key's replayable response headers.
    response_header jsonb,
    -- A finished key's response body, replayed byte for byte.
    response_body bytea,
    -- When the key was recorded: the sweep and the reapers find keys by it.
    created_at timestamp with time zone NOT NULL DEFAULT now(),
    -- When the key last changed.
    updated_at timestamp with time zone NOT NULL DEFAULT now(),
    -- When the key finished.
    finished_at timestamp with time zone,
    -- Mixed into the keys sent to downstream APIs, so that a key forgotten
    -- and sent again is not taken for the old one there.
    downstream_salt uuid DEFAULT gen_random_uuid(),
    -- A parked key's: when it was parked.
    parked_at timestamp with time zone,
    -- The last attempt's error, as Config.RedactError left it.
    last_error text,
    -- How many attempts took the key (the budget is Config.MaxAttempts).
    attempts integer NOT NULL DEFAULT 1,
    -- A waiting or unknown key's: when its backoff ends and the sweep may
    -- resume it.
    next_attempt_at timestamp with time zone,
    -- An unknown key's: when the foreign call's outcome became unknown.
    unknown_at timestamp with time zone,
    -- The phase whose unknown outcome a verdict settled.
    resolved_after text,
    -- A verdict: whether the foreign call happened.
    resolved_happened boolean,
    -- A verdict's note: who settled the outcome and how.
    resolved_note text,
    -- When a verdict settled the outcome.
    resolved_at timestamp with time zone,
    -- A running key's lease, in microseconds from locked_at.
    lease_us bigint,
    -- The end of a foreign call's quiet period: until then nobody takes the
    -- key, so a slow call is never repeated.
    call_until timestamp with time zone,
    -- Set when the key was parked for good (a permanent failure, a panic): a
    -- verdict leaves it parked.
    final_parked_at timestamp with time zone,
    -- A verdict's result (what the downstream said), as JSON.
    resolved_result jsonb,
    -- The workflow version the key runs under.
    workflow_version text DEFAULT NULLIF(current_setting('atomicphase.workflow_version'::text, true), ''::text),
    -- When a foreign phase of the key last began its call: a key that may
    -- have paid.
    called_at timestamp with time zone,
    -- The key's state, the one truth: r running, w waiting, u unknown, p
    -- parked, f finished. Every write names the states it may move a key
    -- from.
    status "char" NOT NULL,
    CONSTRAINT idempotency_keys_pkey PRIMARY KEY (scope, idempotency_key),
    CONSTRAINT idempotency_keys_finished_has_response CHECK (((recovery_point = 'finished'::text) = (response_status IS NOT NULL)))
) WITH (fillfactor=70);
-- The same words, in the catalog (psql's \d+ shows them):
COMMENT ON TABLE idempotency_keys IS 'One row per (scope, idempotency key): the request it was first sent with, where its workflow stands, who holds it, and once finished the response every retry gets.';
COMMENT ON COLUMN idempotency_keys.scope IS 'Whose key it is (a user, an account): keys are unique within a scope only.';
COMMENT ON COLUMN idempotency_keys.idempotency_key IS 'The key the client sent.';
COMMENT ON COLUMN idempotency_keys.workflow IS 'The workflow that runs the request.';
COMMENT ON COLUMN idempotency_keys.fingerprint IS 'A hash of the request (method, path, body, parameters): a retry must match it, or the key is being reused.';
COMMENT ON COLUMN idempotency_keys.request_method IS 'The first request''s HTTP method, for operators.';
COMMENT ON COLUMN idempotency_keys.request_path IS 'The first request''s path and query, for operators.';
COMMENT ON COLUMN idempotency_keys.recovery_point IS 'The last phase committed (started before any; finished at the end): a retry resumes after it.';
COMMENT ON COLUMN idempotency_keys.next_phase IS 'Set when the last committed phase jumped: the phase to run next.';
COMMENT ON COLUMN idempotency_keys.state IS 'The workflow''s state after the last committed phase, as bytes (JSON by default).';
COMMENT ON COLUMN idempotency_keys.lock_token IS 'The token of the attempt that last took the key: every write of a running key names it (fencing).';
COMMENT ON COLUMN idempotency_keys.locked_at IS 'A running key''s lease start, renewed by each phase commit; NULL when nobody holds the key.';
COMMENT ON COLUMN idempotency_keys.response_status IS 'A finished key''s HTTP status.';
COMMENT ON COLUMN idempotency_keys.response_header IS 'A finished key''s replayable response headers.';
COMMENT ON COLUMN idempotency_keys.response_body IS 'A finished key''s response body, replayed byte for byte.';
COMMENT ON COLUMN idempotency_keys.created_at IS 'When the key was recorded: the sweep and the reapers find keys by it.';
COMMENT ON COLUMN idempotency_keys.updated_at IS 'When the key last changed.';
COMMENT ON COLUMN idempotency_keys.finished_at IS 'When the key finished.';
COMMENT ON COLUMN idempotency_keys.downstream_salt IS 'Mixed into the keys sent to downstream APIs, so that a key forgotten and sent again is not taken for the old one there.';
COMMENT ON COLUMN idempotency_keys.parked_at IS 'A parked key''s: when it was parked.';
COMMENT ON COLUMN idempotency_keys.last_error IS 'The last attempt''s error, as Config.RedactError left it.';
COMMENT ON COLUMN idempotency_keys.attempts IS 'How many attempts took the key (the budget is Config.MaxAttempts).';
COMMENT ON COLUMN idempotency_keys.next_attempt_at IS 'A waiting or unknown key''s: when its backoff ends and the sweep may resume it.';
COMMENT ON COLUMN idempotency_keys.unknown_at IS 'An unknown key''s: when the foreign call''s outcome became unknown.';
COMMENT ON COLUMN idempotency_keys.resolved_after IS 'The phase whose unknown outcome a verdict settled.';
COMMENT ON COLUMN idempotency_keys.resolved_happened IS 'A verdict: whether the foreign call happened.';
COMMENT ON COLUMN idempotency_keys.resolved_note IS 'A verdict''s note: who settled the outcome and how.';
COMMENT ON COLUMN idempotency_keys.resolved_at IS 'When a verdict settled the outcome.';
COMMENT ON COLUMN idempotency_keys.lease_us IS 'A running key''s lease, in microseconds from locked_at.';
COMMENT ON COLUMN idempotency_keys.call_until IS 'The end of a foreign call''s quiet period: until then nobody takes the key, so a slow call is never repeated.';
COMMENT ON COLUMN idempotency_keys.final_parked_at IS 'Set when the key was parked for good (a permanent failure, a panic): a verdict leaves it parked.';
COMMENT ON COLUMN idempotency_keys.resolved_result IS 'A verdict''s result (what the downstream said), as JSON.';
COMMENT ON COLUMN idempotency_keys.workflow_version IS 'The workflow version the key runs under.';
COMMENT ON COLUMN idempotency_keys.called_at IS 'When a foreign phase of the key last began its call: a key that may have paid.';
COMMENT ON COLUMN idempotency_keys.status IS 'The key''s state, the one truth: r running, w waiting, u unknown, p parked, f finished. Every write names the states it may move a key from.';
CREATE INDEX idempotency_keys_created_at_idx ON idempotency_keys USING btree (created_at);
CREATE INDEX idempotency_keys_parked_idx ON idempotency_keys USING btree (parked_at) WHERE (parked_at IS NOT NULL);
CREATE INDEX idempotency_keys_waiting_idx ON idempotency_keys USING btree (next_attempt_at) WHERE ((next_attempt_at IS NOT NULL) AND (parked_at IS NULL));

-- What happened to a key off the happy path, one row per event (failed,
-- parked, resumed, unknown, settled…); a key keeps its newest 1000.
CREATE TABLE atomicphase_key_history (
    -- The key's scope.
    scope text NOT NULL,
    -- The key.
    idempotency_key text NOT NULL,
    -- The event's order.
    id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    -- When it happened.
    at timestamp with time zone NOT NULL DEFAULT clock_timestamp(),
    -- What happened.
    event text NOT NULL,
    -- The key's state before, by name.
    status_before text NOT NULL,
    -- The key's state after, by name.
    status text NOT NULL,
    -- The key's recovery point then.
    recovery_point text NOT NULL,
    -- The attempt it happened in.
    attempt integer NOT NULL,
    -- The token of the attempt that held the key.
    lock_token bigint NOT NULL,
    -- The error, if any, as redacted; cleared when the key finishes.
    error text,
    CONSTRAINT atomicphase_key_history_pkey PRIMARY KEY (scope, idempotency_key, id)
);
-- The same words, in the catalog (psql's \d+ shows them):
COMMENT ON TABLE atomicphase_key_history IS 'What happened to a key off the happy path, one row per event (failed, parked, resumed, unknown, settled…); a key keeps its newest 1000.';
COMMENT ON COLUMN atomicphase_key_history.scope IS 'The key''s scope.';
COMMENT ON COLUMN atomicphase_key_history.idempotency_key IS 'The key.';
COMMENT ON COLUMN atomicphase_key_history.id IS 'The event''s order.';
COMMENT ON COLUMN atomicphase_key_history.at IS 'When it happened.';
COMMENT ON COLUMN atomicphase_key_history.event IS 'What happened.';
COMMENT ON COLUMN atomicphase_key_history.status_before IS 'The key''s state before, by name.';
COMMENT ON COLUMN atomicphase_key_history.status IS 'The key''s state after, by name.';
COMMENT ON COLUMN atomicphase_key_history.recovery_point IS 'The key''s recovery point then.';
COMMENT ON COLUMN atomicphase_key_history.attempt IS 'The attempt it happened in.';
COMMENT ON COLUMN atomicphase_key_history.lock_token IS 'The token of the attempt that held the key.';
COMMENT ON COLUMN atomicphase_key_history.error IS 'The error, if any, as redacted; cleared when the key finishes.';

-- What operators did to keys (unpark, verdict, forget…), by whom and why.
CREATE TABLE atomicphase_audit (
    -- The key's scope.
    scope text NOT NULL,
    -- The key.
    idempotency_key text NOT NULL,
    -- The entry's order.
    id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    -- When it was done.
    at timestamp with time zone NOT NULL DEFAULT now(),
    -- Who did it.
    actor text NOT NULL,
    -- What was done.
    action text NOT NULL,
    -- Why, in the operator's words.
    note text NOT NULL DEFAULT ''::text,
    -- What the action saw or changed, as JSON.
    detail jsonb,
    CONSTRAINT atomicphase_audit_pkey PRIMARY KEY (scope, idempotency_key, id)
);
-- The same words, in the catalog (psql's \d+ shows them):
COMMENT ON TABLE atomicphase_audit IS 'What operators did to keys (unpark, verdict, forget…), by whom and why.';
COMMENT ON COLUMN atomicphase_audit.scope IS 'The key''s scope.';
COMMENT ON COLUMN atomicphase_audit.idempotency_key IS 'The key.';
COMMENT ON COLUMN atomicphase_audit.id IS 'The entry''s order.';
COMMENT ON COLUMN atomicphase_audit.at IS 'When it was done.';
COMMENT ON COLUMN atomicphase_audit.actor IS 'Who did it.';
COMMENT ON COLUMN atomicphase_audit.action IS 'What was done.';
COMMENT ON COLUMN atomicphase_audit.note IS 'Why, in the operator''s words.';
COMMENT ON COLUMN atomicphase_audit.detail IS 'What the action saw or changed, as JSON.';

-- Every workflow version a process registered: a key names the version it
-- runs under, and the console shows its phases.
CREATE TABLE atomicphase_workflow_versions (
    -- The workflow.
    workflow text NOT NULL,
    -- Its version.
    version text NOT NULL,
    -- A hash of its phases: a version's shape never changes.
    shape text NOT NULL,
    -- Its phases, in order.
    phases text[] NOT NULL,
    -- When it was first registered.
    registered_at timestamp with time zone NOT NULL DEFAULT now(),
    -- When a live process last said it runs it.
    seen_at timestamp with time zone NOT NULL DEFAULT now(),
    -- When a process of a release that records its release (0.3.0 or later)
    -- last said it runs it; NULL if none has.
    current_seen_at timestamp with time zone,
    -- The last time a process of an older release (one that does not record
    -- its release) was seen to say it runs it; NULL if never.
    older_seen_at timestamp with time zone,
    CONSTRAINT atomicphase_workflow_versions_pkey PRIMARY KEY (workflow, version)
);
-- The same words, in the catalog (psql's \d+ shows them):
COMMENT ON TABLE atomicphase_workflow_versions IS 'Every workflow version a process registered: a key names the version it runs under, and the console shows its phases.';
COMMENT ON COLUMN atomicphase_workflow_versions.workflow IS 'The workflow.';
COMMENT ON COLUMN atomicphase_workflow_versions.version IS 'Its version.';
COMMENT ON COLUMN atomicphase_workflow_versions.shape IS 'A hash of its phases: a version''s shape never changes.';
COMMENT ON COLUMN atomicphase_workflow_versions.phases IS 'Its phases, in order.';
COMMENT ON COLUMN atomicphase_workflow_versions.registered_at IS 'When it was first registered.';
COMMENT ON COLUMN atomicphase_workflow_versions.seen_at IS 'When a live process last said it runs it.';
COMMENT ON COLUMN atomicphase_workflow_versions.current_seen_at IS 'When a process of a release that records its release (0.3.0 or later) last said it runs it; NULL if none has.';
COMMENT ON COLUMN atomicphase_workflow_versions.older_seen_at IS 'The last time a process of an older release (one that does not record its release) was seen to say it runs it; NULL if never.';

-- How far the sweep has looked through keys by creation time, so that it
-- reads only the keys created since.
CREATE TABLE atomicphase_sweep_watermark (
    -- The watermark's name.
    name text NOT NULL,
    -- Every key created before this has been looked at.
    created_before timestamp with time zone NOT NULL,
    -- The next watermark, once the transactions in flight when it was read
    -- have ended.
    pending_before timestamp with time zone,
    -- The transactions that must end before pending_before holds.
    pending_xmax xid8,
    -- On Citus, the same per worker node.
    pending_nodes jsonb,
    CONSTRAINT atomicphase_sweep_watermark_pkey PRIMARY KEY (name)
);
-- The same words, in the catalog (psql's \d+ shows them):
COMMENT ON TABLE atomicphase_sweep_watermark IS 'How far the sweep has looked through keys by creation time, so that it reads only the keys created since.';
COMMENT ON COLUMN atomicphase_sweep_watermark.name IS 'The watermark''s name.';
COMMENT ON COLUMN atomicphase_sweep_watermark.created_before IS 'Every key created before this has been looked at.';
COMMENT ON COLUMN atomicphase_sweep_watermark.pending_before IS 'The next watermark, once the transactions in flight when it was read have ended.';
COMMENT ON COLUMN atomicphase_sweep_watermark.pending_xmax IS 'The transactions that must end before pending_before holds.';
COMMENT ON COLUMN atomicphase_sweep_watermark.pending_nodes IS 'On Citus, the same per worker node.';

-- The migrations applied to this schema (Migrate).
CREATE TABLE atomicphase_migration (
    -- The migration's number.
    version integer NOT NULL,
    -- Its name.
    name text NOT NULL,
    -- When it was applied.
    applied_at timestamp with time zone NOT NULL DEFAULT now(),
    CONSTRAINT atomicphase_migration_pkey PRIMARY KEY (version)
);
-- The same words, in the catalog (psql's \d+ shows them):
COMMENT ON TABLE atomicphase_migration IS 'The migrations applied to this schema (Migrate).';
COMMENT ON COLUMN atomicphase_migration.version IS 'The migration''s number.';
COMMENT ON COLUMN atomicphase_migration.name IS 'Its name.';
COMMENT ON COLUMN atomicphase_migration.applied_at IS 'When it was applied.';

-- The releases live processes run, by the migration each needs: a contract
-- step refuses while a process whose release needs an older schema was seen
-- recently.
CREATE TABLE atomicphase_releases (
    -- The migration the release needs the database to have reached
    -- (MinVersion).
    needs integer NOT NULL,
    -- When a process of such a release last announced itself.
    seen_at timestamp with time zone NOT NULL DEFAULT now(),
    CONSTRAINT atomicphase_releases_pkey PRIMARY KEY (needs)
);
-- The same words, in the catalog (psql's \d+ shows them):
COMMENT ON TABLE atomicphase_releases IS 'The releases live processes run, by the migration each needs: a contract step refuses while a process whose release needs an older schema was seen recently.';
COMMENT ON COLUMN atomicphase_releases.needs IS 'The migration the release needs the database to have reached (MinVersion).';
COMMENT ON COLUMN atomicphase_releases.seen_at IS 'When a process of such a release last announced itself.';

-- Functions, by name. A function's body is checked when it runs, not
-- here, as pg_dump has it: some call functions written after them.

SET check_function_bodies = off;

-- Decides an arriving request in one statement (a previous release's way in):
-- records a new key, replays a finished one, refuses one held or reused, or
-- takes one nobody holds.
CREATE OR REPLACE FUNCTION atomicphase_acquire(p_scope text, p_key text, p_workflow text, p_fingerprint bytea, p_method text, p_path text, p_state bytea, p_lock_timeout_us bigint, p_lock_token bigint, p_max_unfinished integer, OUT acquired boolean, OUT workflow text, OUT fingerprint bytea, OUT recovery_point text, OUT next_phase text, OUT state bytea, OUT lock_token bigint, OUT lock_expires_in double precision, OUT downstream_salt uuid, OUT attempts integer, OUT took_over boolean, OUT over_limit boolean, OUT response_status integer, OUT response_header jsonb, OUT response_body bytea)
 RETURNS record
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_now      timestamptz := now();
    held_since timestamptz;
    v_until    timestamptz;
    v_expires  timestamptz;
    v_backoff  timestamptz;
    v_lease    bigint;
    v_status   "char";
BEGIN
    acquired := false;
    took_over := false;
    over_limit := false;
    attempts := 0;
    FOR round IN 1..2 LOOP
        SELECT k.workflow, k.fingerprint, k.recovery_point, k.next_phase, k.lock_token,
               k.locked_at, atomicphase_held_until(k.locked_at, k.lease_us, k.call_until, p_lock_timeout_us),
               atomicphase_lock_expires(k.locked_at, k.lease_us, k.call_until, p_lock_timeout_us, v_now),
               k.attempts, k.response_status, k.response_header, k.response_body,
               CASE WHEN k.status = 'u' AND k.updated_at > k.unknown_at THEN k.next_attempt_at END,
               coalesce(k.lease_us, p_lock_timeout_us), k.status
        INTO workflow, fingerprint, recovery_point, next_phase, lock_token,
             held_since, v_until, v_expires, attempts, response_status, response_header, response_body,
             v_backoff, v_lease, v_status
        FROM idempotency_keys k
        WHERE k.scope = p_scope AND k.idempotency_key = p_key;
        IF FOUND AND v_backoff > v_now AND v_backoff > coalesce(v_until, '-infinity') THEN
            -- Held by its reconciliation's backoff (above).
            v_until := v_backoff;
            v_expires := v_backoff;
        END IF;
        IF FOUND AND (v_status = 'f' OR workflow <> p_workflow
                      OR fingerprint <> p_fingerprint OR v_until >= v_now) THEN
            lock_expires_in := extract(epoch FROM v_expires - v_now)::float8;
            -- No live lease holds it (above).
            took_over := v_status <> 'f' AND v_until >= v_now
                         AND NOT coalesce(v_now - held_since <= v_lease::float8 * interval '1 microsecond', false);
            RETURN;
        END IF;
        took_over := FOUND AND v_status = 'r';
        IF NOT FOUND AND NOT pg_try_advisory_xact_lock(hashtextextended(p_scope || chr(31) || p_key, 7::bigint)) THEN
            EXIT; -- being recorded by another transaction: held
        END IF;
        IF NOT FOUND AND p_max_unfinished IS NOT NULL AND p_max_unfinished::bigint <= (
                SELECT count(*) FROM (
                    SELECT 1 FROM idempotency_keys u
                    WHERE u.scope = p_scope AND u.response_status IS NULL AND u.parked_at IS NULL
                    LIMIT p_max_unfinished) AS capped) THEN
            over_limit := true;
            attempts := 0;
            workflow := p_workflow;
            fingerprint := p_fingerprint;
            recovery_point := 'started';
            lock_token := 0;
            RETURN;
        END IF;

        INSERT INTO idempotency_keys AS k
            (scope, idempotency_key, workflow, fingerprint, request_method, request_path,
             state, lock_token, locked_at, lease_us, status)
        VALUES (p_scope, p_key, p_workflow, p_fingerprint, p_method, p_path,
                p_state, p_lock_token, v_now, p_lock_timeout_us, 'r')
        ON CONFLICT (scope, idempotency_key) DO UPDATE
            SET locked_at = v_now, lock_token = p_lock_token, updated_at = v_now,
                attempts = k.attempts + 1, parked_at = NULL, next_attempt_at = v_now,
                lease_us = p_lock_timeout_us, status = 'r'
            WHERE k.status = ANY ('{r,w,u,p}'::"char"[]) /* from: run */ AND k.workflow = p_workflow
              AND (k.final_parked_at IS NULL OR k.final_parked_at IS DISTINCT FROM k.parked_at)
              AND k.fingerprint = p_fingerprint
              AND (k.status <> 'r' OR v_now - k.locked_at > coalesce(k.lease_us, p_lock_timeout_us)::float8 * interval '1 microsecond')
              AND (k.call_until IS NULL OR k.call_until < v_now)
              AND NOT (k.status = 'u' AND k.updated_at > k.unknown_at
                       AND k.next_attempt_at IS NOT NULL AND k.next_attempt_at > v_now)
        RETURNING k.workflow, k.fingerprint, k.recovery_point, k.next_phase, k.state,
                  k.lock_token, k.downstream_salt, k.attempts
        INTO workflow, fingerprint, recovery_point, next_phase, state,
             lock_token, downstream_salt, attempts;
        IF FOUND THEN
            acquired := true;
            response_status := NULL;
            response_header := NULL;
            response_body := NULL;
            IF attempts > 1 THEN
                -- A take, not a new key's recording.
                PERFORM atomicphase_key_event(p_scope, p_key,
                    CASE WHEN took_over THEN 'taken_over' END, coalesce(v_status, 'w'), 'r',
                    recovery_point, attempts, p_lock_token, NULL);
            END IF;
            RETURN;
        END IF;
        -- Another attempt took the key between the read and the upsert.
        took_over := false;
    END LOOP;
    -- Contended, or being recorded: report the key as held, with no expiry
    -- known, so the caller gets the default retry-after.
    workflow := p_workflow;
    fingerprint := p_fingerprint;
    recovery_point := 'started';
    lock_token := 0;
    attempts := 0;
    lock_expires_in := NULL;
    took_over := false;
END
$function$;
COMMENT ON FUNCTION atomicphase_acquire(p_scope text, p_key text, p_workflow text, p_fingerprint bytea, p_method text, p_path text, p_state bytea, p_lock_timeout_us bigint, p_lock_token bigint, p_max_unfinished integer, OUT acquired boolean, OUT workflow text, OUT fingerprint bytea, OUT recovery_point text, OUT next_phase text, OUT state bytea, OUT lock_token bigint, OUT lock_expires_in double precision, OUT downstream_salt uuid, OUT attempts integer, OUT took_over boolean, OUT over_limit boolean, OUT response_status integer, OUT response_header jsonb, OUT response_body bytea) IS 'Decides an arriving request in one statement (a previous release''s way in): records a new key, replays a finished one, refuses one held or reused, or takes one nobody holds.';

-- atomicphase_acquire with the workflow version and parking told apart: a
-- request's way in for a workflow that begins with a foreign phase or a scope
-- with a cap on unfinished keys.
CREATE OR REPLACE FUNCTION atomicphase_admit(p_scope text, p_key text, p_workflow text, p_fingerprint bytea, p_method text, p_path text, p_state bytea, p_lock_timeout_us bigint, p_lock_token bigint, p_max_unfinished integer, OUT acquired boolean, OUT workflow text, OUT fingerprint bytea, OUT recovery_point text, OUT next_phase text, OUT state bytea, OUT lock_token bigint, OUT lock_expires_in double precision, OUT downstream_salt uuid, OUT attempts integer, OUT took_over boolean, OUT over_limit boolean, OUT response_status integer, OUT response_header jsonb, OUT response_body bytea, OUT parked boolean)
 RETURNS record
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_max integer := p_max_unfinished;
BEGIN
    SELECT k.status = 'p' AND k.workflow = p_workflow AND k.fingerprint = p_fingerprint
               AND k.final_parked_at = k.parked_at,
           k.workflow, k.fingerprint, k.recovery_point, k.next_phase, k.attempts
    INTO parked, workflow, fingerprint, recovery_point, next_phase, attempts
    FROM idempotency_keys k
    WHERE k.scope = p_scope AND k.idempotency_key = p_key;
    IF FOUND AND parked THEN
        acquired := false;
        took_over := false;
        over_limit := false;
        lock_token := 0;
        RETURN;
    END IF;
    IF NOT FOUND AND v_max IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(hashtextextended('atomicphase.scope_cap:' || p_scope, 0::bigint));
        v_max := greatest(0, v_max - (
            SELECT count(*) FROM (
                SELECT 1 FROM idempotency_keys u
                WHERE u.scope = p_scope AND u.response_status IS NULL AND u.parked_at IS NOT NULL
                LIMIT v_max) AS capped))::integer;
    END IF;
    SELECT a.acquired, a.workflow, a.fingerprint, a.recovery_point, a.next_phase, a.state,
           a.lock_token, a.lock_expires_in, a.downstream_salt, a.attempts, a.took_over,
           a.over_limit, a.response_status, a.response_header, a.response_body, false
    INTO acquired, workflow, fingerprint, recovery_point, next_phase, state,
         lock_token, lock_expires_in, downstream_salt, attempts, took_over,
         over_limit, response_status, response_header, response_body, parked
    FROM atomicphase_acquire(
        p_scope, p_key, p_workflow, p_fingerprint, p_method, p_path, p_state,
        p_lock_timeout_us, p_lock_token, v_max) AS a;
END
$function$;
COMMENT ON FUNCTION atomicphase_admit(p_scope text, p_key text, p_workflow text, p_fingerprint bytea, p_method text, p_path text, p_state bytea, p_lock_timeout_us bigint, p_lock_token bigint, p_max_unfinished integer, OUT acquired boolean, OUT workflow text, OUT fingerprint bytea, OUT recovery_point text, OUT next_phase text, OUT state bytea, OUT lock_token bigint, OUT lock_expires_in double precision, OUT downstream_salt uuid, OUT attempts integer, OUT took_over boolean, OUT over_limit boolean, OUT response_status integer, OUT response_header jsonb, OUT response_body bytea, OUT parked boolean) IS 'atomicphase_acquire with the workflow version and parking told apart: a request''s way in for a workflow that begins with a foreign phase or a scope with a cap on unfinished keys.';

-- atomicphase_acquire with the workflow version and parking told apart: a
-- request's way in for a workflow that begins with a foreign phase or a scope
-- with a cap on unfinished keys.
CREATE OR REPLACE FUNCTION atomicphase_admit(p_scope text, p_key text, p_workflow text, p_fingerprint bytea, p_method text, p_path text, p_state bytea, p_lock_timeout_us bigint, p_lock_token bigint, p_max_unfinished integer, p_version text, OUT acquired boolean, OUT workflow text, OUT fingerprint bytea, OUT recovery_point text, OUT next_phase text, OUT state bytea, OUT lock_token bigint, OUT lock_expires_in double precision, OUT downstream_salt uuid, OUT attempts integer, OUT took_over boolean, OUT over_limit boolean, OUT response_status integer, OUT response_header jsonb, OUT response_body bytea, OUT parked boolean, OUT workflow_version text)
 RETURNS record
 LANGUAGE plpgsql
AS $function$
BEGIN
    PERFORM set_config('atomicphase.workflow_version', coalesce(p_version, ''), true);
    SELECT a.acquired, a.workflow, a.fingerprint, a.recovery_point, a.next_phase, a.state,
           a.lock_token, a.lock_expires_in, a.downstream_salt, a.attempts, a.took_over,
           a.over_limit, a.response_status, a.response_header, a.response_body, a.parked
    INTO acquired, workflow, fingerprint, recovery_point, next_phase, state,
         lock_token, lock_expires_in, downstream_salt, attempts, took_over,
         over_limit, response_status, response_header, response_body, parked
    FROM atomicphase_admit(
        p_scope, p_key, p_workflow, p_fingerprint, p_method, p_path, p_state,
        p_lock_timeout_us, p_lock_token, p_max_unfinished) AS a;
    PERFORM set_config('atomicphase.workflow_version', '', true);
    IF acquired THEN
        SELECT k.workflow_version INTO workflow_version
        FROM idempotency_keys k
        WHERE k.scope = p_scope AND k.idempotency_key = p_key;
    END IF;
END
$function$;
COMMENT ON FUNCTION atomicphase_admit(p_scope text, p_key text, p_workflow text, p_fingerprint bytea, p_method text, p_path text, p_state bytea, p_lock_timeout_us bigint, p_lock_token bigint, p_max_unfinished integer, p_version text, OUT acquired boolean, OUT workflow text, OUT fingerprint bytea, OUT recovery_point text, OUT next_phase text, OUT state bytea, OUT lock_token bigint, OUT lock_expires_in double precision, OUT downstream_salt uuid, OUT attempts integer, OUT took_over boolean, OUT over_limit boolean, OUT response_status integer, OUT response_header jsonb, OUT response_body bytea, OUT parked boolean, OUT workflow_version text) IS 'atomicphase_acquire with the workflow version and parking told apart: a request''s way in for a workflow that begins with a foreign phase or a scope with a cap on unfinished keys.';

-- Commits a phase's recovery point and state (and, at the end, the response)
-- for the attempt that holds the key; raises when the key is no longer its.
CREATE OR REPLACE FUNCTION atomicphase_checkpoint(p_scope text, p_key text, p_lock_token bigint, p_recovery_point text, p_next_phase text, p_state bytea, p_status integer, p_header jsonb, p_body bytea)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_now   timestamptz := clock_timestamp();
    v_tries integer;
    v_mark  boolean;
BEGIN
    UPDATE idempotency_keys SET
        recovery_point  = p_recovery_point,
        next_phase      = p_next_phase,
        state           = p_state,
        locked_at       = CASE WHEN p_status IS NULL THEN v_now END,
        response_status = p_status,
        response_header = p_header,
        response_body   = p_body,
        finished_at     = CASE WHEN p_status IS NOT NULL THEN v_now END,
        unknown_at      = NULL,
        next_attempt_at = CASE WHEN p_status IS NULL THEN next_attempt_at END,
        call_until      = NULL,
        updated_at      = v_now,
        status          = CASE WHEN p_status IS NULL THEN 'r' ELSE 'f' END
    WHERE scope = p_scope
      AND idempotency_key = p_key
      AND lock_token = p_lock_token
      AND status = 'r' /* from: run */
    RETURNING attempts, resolved_at IS NOT NULL INTO v_tries, v_mark;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'idempotency key % lost its lock to a newer attempt', p_key
            USING ERRCODE = 'AP001';
    END IF;
    IF p_status IS NOT NULL AND (v_tries > 1 OR v_mark) THEN
        PERFORM atomicphase_key_event(p_scope, p_key, 'finished', 'r', 'f',
            p_recovery_point, v_tries, p_lock_token, NULL);
    END IF;
END
$function$;
COMMENT ON FUNCTION atomicphase_checkpoint(p_scope text, p_key text, p_lock_token bigint, p_recovery_point text, p_next_phase text, p_state bytea, p_status integer, p_header jsonb, p_body bytea) IS 'Commits a phase''s recovery point and state (and, at the end, the response) for the attempt that holds the key; raises when the key is no longer its.';

-- Takes the transaction's advisory lock on a new key before it is recorded,
-- raising AP002 when another transaction holds it and AP003 when the key
-- exists.
CREATE OR REPLACE FUNCTION atomicphase_claim(p_scope text, p_key text)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtextextended(p_scope || chr(31) || p_key, 7)) THEN
        RAISE EXCEPTION 'idempotency key % is being recorded by another request', p_key
            USING ERRCODE = 'AP002';
    END IF;
    -- Every recording holds the lock until it commits: once it is ours, a
    -- key recorded before shows in this statement's snapshot.
    IF EXISTS (SELECT 1 FROM idempotency_keys k
               WHERE k.scope = p_scope AND k.idempotency_key = p_key) THEN
        RAISE EXCEPTION 'idempotency key % was recorded by another request meanwhile', p_key
            USING ERRCODE = 'AP003';
    END IF;
END
$function$;
COMMENT ON FUNCTION atomicphase_claim(p_scope text, p_key text) IS 'Takes the transaction''s advisory lock on a new key before it is recorded, raising AP002 when another transaction holds it and AP003 when the key exists.';

-- When a key stops being held: the end of its lease or of a foreign call's
-- quiet period, whichever is later.
CREATE OR REPLACE FUNCTION atomicphase_held_until(p_locked_at timestamp with time zone, p_lease_us bigint, p_call_until timestamp with time zone, p_lock_timeout_us bigint)
 RETURNS timestamp with time zone
 LANGUAGE sql
 STABLE PARALLEL SAFE
AS $function$
    SELECT greatest(p_locked_at + coalesce(p_lease_us, p_lock_timeout_us) * interval '1 microsecond', p_call_until)
$function$;
COMMENT ON FUNCTION atomicphase_held_until(p_locked_at timestamp with time zone, p_lease_us bigint, p_call_until timestamp with time zone, p_lock_timeout_us bigint) IS 'When a key stops being held: the end of its lease or of a foreign call''s quiet period, whichever is later.';

-- The DELETE guard: refuses to delete a key that is unfinished or whose
-- history matters, unless the transaction forgets it on purpose
-- (atomicphase.forget_forced), and deletes its history with it.
CREATE OR REPLACE FUNCTION atomicphase_key_delete()
 RETURNS trigger
 LANGUAGE plpgsql
 SET search_path TO 'public', 'pg_temp'
AS $function$
DECLARE
    v_allowed boolean := false;
BEGIN
    PERFORM atomicphase_key_table_fired(TG_RELID);
    IF OLD.status = 'f'
       OR (OLD.status = 'p' AND OLD.unknown_at IS NULL AND OLD.called_at IS NULL
           AND coalesce(OLD.call_until < now(), true))
       OR current_setting('atomicphase.forget_forced', true) = 'on' THEN
        v_allowed := true;
    -- The trail, where it is on the key's node (the key table's schema),
    -- read apart: a statement naming a table that is not there fails
    -- when it is planned.
    ELSIF OLD.status = 'p' AND EXISTS (
              SELECT FROM pg_catalog.pg_class c
              WHERE c.relname = 'atomicphase_audit' AND c.relnamespace = (
                  SELECT t.relnamespace FROM pg_catalog.pg_class t WHERE t.oid = TG_RELID)) THEN
        v_allowed := EXISTS (SELECT 1 FROM atomicphase_audit a
                            WHERE a.scope = OLD.scope AND a.idempotency_key = OLD.idempotency_key
                              AND a.action = 'forget' AND a.detail @> '{"forced": true, "status_before": "parked"}'
                              AND a.at >= OLD.parked_at);
    END IF;
    IF NOT v_allowed THEN
        RAISE EXCEPTION 'idempotency key % is %, and may have paid: only a forced forget deletes it', OLD.idempotency_key,
            atomicphase_state_name(OLD.status)
            USING ERRCODE = 'AP011';
    END IF;
    DELETE FROM atomicphase_key_history h
    WHERE h.scope = OLD.scope AND h.idempotency_key = OLD.idempotency_key;
    RETURN NULL;
END
$function$;
COMMENT ON FUNCTION atomicphase_key_delete() IS 'The DELETE guard: refuses to delete a key that is unfinished or whose history matters, unless the transaction forgets it on purpose (atomicphase.forget_forced), and deletes its history with it.';
REVOKE EXECUTE ON FUNCTION atomicphase_key_delete() FROM PUBLIC;

-- Writes one event into a key's history, keeping its newest 1000.
CREATE OR REPLACE FUNCTION atomicphase_key_event(p_scope text, p_key text, p_event text, p_from "char", p_to "char", p_recovery_point text, p_attempt integer, p_lock_token bigint, p_error text)
 RETURNS void
 LANGUAGE plpgsql
 SET search_path TO 'public', 'pg_temp'
AS $function$
DECLARE
    v_event text := coalesce(p_event, CASE
        WHEN p_from = 'r' AND p_to = 'w' THEN 'failed'
        WHEN p_from = 'r' THEN atomicphase_state_name(p_to)
        WHEN p_to = 'r' THEN 'resumed'
        WHEN p_from = 'p' THEN 'unparked'
        WHEN p_to = 'p' OR p_to = 'u' THEN atomicphase_state_name(p_to)
        ELSE 'settled' END);
BEGIN
    INSERT INTO atomicphase_key_history
        (scope, idempotency_key, event, status_before, status, recovery_point, attempt, lock_token, error)
    VALUES (p_scope, p_key, v_event, atomicphase_state_name(p_from),
            atomicphase_state_name(p_to), p_recovery_point, p_attempt, p_lock_token, p_error);
    IF p_to = 'f' THEN
        UPDATE atomicphase_key_history h SET error = NULL
        WHERE h.scope = p_scope AND h.idempotency_key = p_key AND h.error IS NOT NULL;
    ELSE
        -- (In time order: on Citus an event's id depends on the node its
        -- shard is on.)
        DELETE FROM atomicphase_key_history h
        WHERE h.scope = p_scope AND h.idempotency_key = p_key
          AND (h.at, h.id) <= (SELECT o.at, o.id FROM atomicphase_key_history o
                               WHERE o.scope = p_scope AND o.idempotency_key = p_key
                               ORDER BY o.at DESC, o.id DESC OFFSET 1000 LIMIT 1);
    END IF;
END
$function$;
COMMENT ON FUNCTION atomicphase_key_event(p_scope text, p_key text, p_event text, p_from "char", p_to "char", p_recovery_point text, p_attempt integer, p_lock_token bigint, p_error text) IS 'Writes one event into a key''s history, keeping its newest 1000.';

-- Whether a trigger fired for the key table (or one of its shards): the
-- DELETE guard checks it before reading a row.
CREATE OR REPLACE FUNCTION atomicphase_key_table_fired(p_relation oid)
 RETURNS void
 LANGUAGE plpgsql
 STABLE
 SET search_path TO 'public', 'pg_temp'
AS $function$
DECLARE
    v_keys oid := (SELECT t.typrelid FROM pg_catalog.pg_type t
                   WHERE t.oid OPERATOR(pg_catalog.=) pg_catalog.pg_typeof(NULL::idempotency_keys)::pg_catalog.oid);
    v_shard boolean := false;
BEGIN
    -- Every operator named with its schema, and every comparison between
    -- values of one type: a role that may create objects on the path
    -- (MigrateOpts.AllowPublicCreate) finds nothing here to stand in for.
    IF p_relation OPERATOR(pg_catalog.=) v_keys THEN
        RETURN;
    END IF;
    -- A shard of the key table, named after it with its shard id, in its
    -- schema (read apart: pg_dist_shard is there only with Citus).
    IF EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'citus'::pg_catalog.name) THEN
        EXECUTE $q$SELECT EXISTS (
                SELECT FROM pg_catalog.pg_dist_shard s, pg_catalog.pg_class k, pg_catalog.pg_class r
                WHERE s.logicalrelid::pg_catalog.oid OPERATOR(pg_catalog.=) $1 AND k.oid OPERATOR(pg_catalog.=) $1
                  AND r.oid OPERATOR(pg_catalog.=) $2 AND r.relnamespace OPERATOR(pg_catalog.=) k.relnamespace
                  AND r.relname::pg_catalog.text OPERATOR(pg_catalog.=)
                      (k.relname::pg_catalog.text OPERATOR(pg_catalog.||) '_'::pg_catalog.text OPERATOR(pg_catalog.||) s.shardid::pg_catalog.text))$q$
            INTO v_shard USING v_keys, p_relation;
    END IF;
    IF NOT v_shard THEN
        RAISE EXCEPTION 'atomicphase''s key triggers run for its key table only, not for %', p_relation::regclass
            USING ERRCODE = 'AP012';
    END IF;
END
$function$;
COMMENT ON FUNCTION atomicphase_key_table_fired(p_relation oid) IS 'Whether a trigger fired for the key table (or one of its shards): the DELETE guard checks it before reading a row.';

-- How long until a key may be taken, from its lease and quiet period.
CREATE OR REPLACE FUNCTION atomicphase_lock_expires(p_locked_at timestamp with time zone, p_lease_us bigint, p_call_until timestamp with time zone, p_lock_timeout_us bigint, p_now timestamp with time zone)
 RETURNS timestamp with time zone
 LANGUAGE sql
 STABLE PARALLEL SAFE
AS $function$
    SELECT CASE
        WHEN p_locked_at + coalesce(p_lease_us, p_lock_timeout_us) * interval '1 microsecond' >= p_now
          OR p_call_until IS NULL
          OR p_call_until < p_locked_at + coalesce(p_lease_us, p_lock_timeout_us) * interval '1 microsecond'
        THEN p_locked_at + coalesce(p_lease_us, p_lock_timeout_us) * interval '1 microsecond'
        ELSE p_call_until END
$function$;
COMMENT ON FUNCTION atomicphase_lock_expires(p_locked_at timestamp with time zone, p_lease_us bigint, p_call_until timestamp with time zone, p_lock_timeout_us bigint, p_now timestamp with time zone) IS 'How long until a key may be taken, from its lease and quiet period.';

-- Whether a lock taken at a time is stale by a cutoff (a previous release's
-- rule).
CREATE OR REPLACE FUNCTION atomicphase_lock_takeable(p_locked_at timestamp with time zone, p_stale_before timestamp with time zone)
 RETURNS boolean
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
    SELECT p_locked_at IS NULL OR p_locked_at < p_stale_before
$function$;
COMMENT ON FUNCTION atomicphase_lock_takeable(p_locked_at timestamp with time zone, p_stale_before timestamp with time zone) IS 'Whether a lock taken at a time is stale by a cutoff (a previous release''s rule).';

-- Records a new key on its own (a previous release's way, and the way for a
-- scope with a cap on unfinished keys).
CREATE OR REPLACE FUNCTION atomicphase_record(p_scope text, p_key text, p_workflow text, p_fingerprint bytea, p_method text, p_path text, p_state bytea, p_lock_token bigint, p_max_unfinished integer)
 RETURNS TABLE(downstream_salt uuid)
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_now timestamptz := now();
BEGIN
    IF p_max_unfinished IS NOT NULL AND p_max_unfinished <= (
            SELECT count(*) FROM (
                SELECT 1 FROM idempotency_keys u
                WHERE u.scope = p_scope AND u.response_status IS NULL AND u.parked_at IS NULL
                LIMIT p_max_unfinished) AS capped) THEN
        RETURN;
    END IF;
    INSERT INTO idempotency_keys AS k
        (scope, idempotency_key, workflow, fingerprint, request_method, request_path,
         state, lock_token, locked_at, created_at, updated_at)
    VALUES (p_scope, p_key, p_workflow, p_fingerprint, p_method, p_path,
            p_state, p_lock_token, v_now, v_now, v_now)
    ON CONFLICT (scope, idempotency_key) DO NOTHING
    RETURNING k.downstream_salt INTO downstream_salt;
    IF FOUND THEN
        RETURN NEXT;
    END IF;
END
$function$;
COMMENT ON FUNCTION atomicphase_record(p_scope text, p_key text, p_workflow text, p_fingerprint bytea, p_method text, p_path text, p_state bytea, p_lock_token bigint, p_max_unfinished integer) IS 'Records a new key on its own (a previous release''s way, and the way for a scope with a cap on unfinished keys).';

-- Records a new key on its own (a previous release's way, and the way for a
-- scope with a cap on unfinished keys).
CREATE OR REPLACE FUNCTION atomicphase_record(p_scope text, p_key text, p_workflow text, p_fingerprint bytea, p_method text, p_path text, p_state bytea, p_lock_token bigint, p_max_unfinished integer, p_lease_us bigint)
 RETURNS TABLE(downstream_salt uuid)
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_now timestamptz := now();
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtextextended(p_scope || chr(31) || p_key, 7::bigint)) THEN
        RAISE EXCEPTION 'idempotency key % is being recorded by another request', p_key
            USING ERRCODE = 'AP002';
    END IF;
    IF p_max_unfinished IS NOT NULL AND p_max_unfinished::bigint <= (
            SELECT count(*) FROM (
                SELECT 1 FROM idempotency_keys u
                WHERE u.scope = p_scope AND u.response_status IS NULL AND u.parked_at IS NULL
                LIMIT p_max_unfinished) AS capped) THEN
        RETURN;
    END IF;
    INSERT INTO idempotency_keys AS k
        (scope, idempotency_key, workflow, fingerprint, request_method, request_path,
         state, lock_token, locked_at, created_at, updated_at, lease_us, status)
    VALUES (p_scope, p_key, p_workflow, p_fingerprint, p_method, p_path,
            p_state, p_lock_token, v_now, v_now, v_now, p_lease_us, 'r')
    ON CONFLICT (scope, idempotency_key) DO NOTHING
    RETURNING k.downstream_salt INTO downstream_salt;
    IF FOUND THEN
        RETURN NEXT;
    END IF;
END
$function$;
COMMENT ON FUNCTION atomicphase_record(p_scope text, p_key text, p_workflow text, p_fingerprint bytea, p_method text, p_path text, p_state bytea, p_lock_token bigint, p_max_unfinished integer, p_lease_us bigint) IS 'Records a new key on its own (a previous release''s way, and the way for a scope with a cap on unfinished keys).';

-- Records a new key on its own (a previous release's way, and the way for a
-- scope with a cap on unfinished keys).
CREATE OR REPLACE FUNCTION atomicphase_record(p_scope text, p_key text, p_workflow text, p_fingerprint bytea, p_method text, p_path text, p_state bytea, p_lock_token bigint, p_max_unfinished integer, p_lease_us bigint, p_version text)
 RETURNS TABLE(downstream_salt uuid)
 LANGUAGE plpgsql
AS $function$
BEGIN
    PERFORM set_config('atomicphase.workflow_version', coalesce(p_version, ''), true);
    RETURN QUERY SELECT r.downstream_salt FROM atomicphase_record(
        p_scope, p_key, p_workflow, p_fingerprint, p_method, p_path, p_state,
        p_lock_token, p_max_unfinished, p_lease_us) AS r;
    PERFORM set_config('atomicphase.workflow_version', '', true);
END
$function$;
COMMENT ON FUNCTION atomicphase_record(p_scope text, p_key text, p_workflow text, p_fingerprint bytea, p_method text, p_path text, p_state bytea, p_lock_token bigint, p_max_unfinished integer, p_lease_us bigint, p_version text) IS 'Records a new key on its own (a previous release''s way, and the way for a scope with a cap on unfinished keys).';

-- Records a new key with its first unit's checkpoint, at the head of that
-- unit's batch, where a plain statement cannot (Citus).
CREATE OR REPLACE FUNCTION atomicphase_record_first(p_scope text, p_key text, p_workflow text, p_fingerprint bytea, p_method text, p_path text, p_lock_token bigint, p_lease_us bigint, p_version text, p_recovery_point text, p_next_phase text, p_state bytea, p_status integer, p_header jsonb, p_body bytea)
 RETURNS TABLE(downstream_salt uuid)
 LANGUAGE plpgsql
AS $function$
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
    INSERT INTO idempotency_keys AS k
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
$function$;
COMMENT ON FUNCTION atomicphase_record_first(p_scope text, p_key text, p_workflow text, p_fingerprint bytea, p_method text, p_path text, p_lock_token bigint, p_lease_us bigint, p_version text, p_recovery_point text, p_next_phase text, p_state bytea, p_status integer, p_header jsonb, p_body bytea) IS 'Records a new key with its first unit''s checkpoint, at the head of that unit''s batch, where a plain statement cannot (Citus).';

-- Records a verdict on an unknown outcome (a previous release's
-- RecordResolution).
CREATE OR REPLACE FUNCTION atomicphase_record_resolution(p_scope text, p_key text, p_happened boolean, p_note text, p_lock_timeout_us bigint)
 RETURNS SETOF text
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_now    timestamptz := now();
    v_before "char";
    v_after  "char";
    v_point  text;
    v_tries  integer;
    v_token  bigint;
    v_workflow text;
BEGIN
    UPDATE idempotency_keys AS k
    SET resolved_after = k.recovery_point, resolved_happened = p_happened, resolved_note = p_note,
        resolved_result = NULL, resolved_at = v_now,
        parked_at = CASE WHEN k.final_parked_at = k.parked_at THEN k.parked_at END,
        next_attempt_at = CASE WHEN k.final_parked_at = k.parked_at THEN k.next_attempt_at ELSE v_now END,
        updated_at = v_now,
        status = CASE WHEN k.status = 'p' AND k.final_parked_at = k.parked_at THEN 'p'
                      WHEN k.status = 'r' THEN 'r' WHEN k.unknown_at IS NOT NULL THEN 'u' ELSE 'w' END
    FROM (SELECT b.status FROM idempotency_keys b
          WHERE b.scope = p_scope AND b.idempotency_key = p_key) AS before
    WHERE k.scope = p_scope AND k.idempotency_key = p_key
      AND k.status = ANY ('{r,u,p}'::"char"[]) /* from: verdict */
      AND (k.status <> 'r' OR v_now - k.locked_at > coalesce(k.lease_us, p_lock_timeout_us)::float8 * interval '1 microsecond')
      AND (k.call_until IS NULL OR k.call_until < v_now)
    RETURNING k.workflow, before.status, k.status, k.recovery_point, k.attempts, k.lock_token
    INTO v_workflow, v_before, v_after, v_point, v_tries, v_token;
    IF FOUND THEN
        PERFORM atomicphase_key_event(p_scope, p_key, 'resolved', v_before, v_after,
            v_point, v_tries, v_token, NULL);
        RETURN NEXT v_workflow;
    END IF;
END
$function$;
COMMENT ON FUNCTION atomicphase_record_resolution(p_scope text, p_key text, p_happened boolean, p_note text, p_lock_timeout_us bigint) IS 'Records a verdict on an unknown outcome (a previous release''s RecordResolution).';

-- Records a new key at its first unit's commit (a previous release's way).
CREATE OR REPLACE FUNCTION atomicphase_record_unit(p_scope text, p_key text, p_workflow text, p_fingerprint bytea, p_method text, p_path text, p_lock_token bigint, p_lease_us bigint, p_version text, p_recovery_point text, p_next_phase text, p_state bytea, p_status integer, p_header jsonb, p_body bytea)
 RETURNS TABLE(downstream_salt uuid)
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
    INSERT INTO idempotency_keys AS k
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
$function$;
COMMENT ON FUNCTION atomicphase_record_unit(p_scope text, p_key text, p_workflow text, p_fingerprint bytea, p_method text, p_path text, p_lock_token bigint, p_lease_us bigint, p_version text, p_recovery_point text, p_next_phase text, p_state bytea, p_status integer, p_header jsonb, p_body bytea) IS 'Records a new key at its first unit''s commit (a previous release''s way).';

-- Records a verdict on an unknown outcome with its result, and moves the key
-- as the state table allows.
CREATE OR REPLACE FUNCTION atomicphase_record_verdict(p_scope text, p_key text, p_happened boolean, p_note text, p_lock_timeout_us bigint, p_result jsonb)
 RETURNS TABLE(workflow text, recorded boolean)
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_now    timestamptz := now();
    v_before "char";
    v_after  "char";
    v_point  text;
    v_tries  integer;
    v_token  bigint;
BEGIN
    UPDATE idempotency_keys AS k
    SET resolved_after = k.recovery_point, resolved_happened = p_happened, resolved_note = p_note,
        resolved_result = p_result, resolved_at = v_now,
        parked_at = CASE WHEN k.final_parked_at = k.parked_at THEN k.parked_at END,
        next_attempt_at = CASE WHEN k.final_parked_at = k.parked_at THEN k.next_attempt_at ELSE v_now END,
        updated_at = v_now, attempts = CASE WHEN k.final_parked_at = k.parked_at THEN k.attempts ELSE 1 END,
        status = CASE WHEN k.status = 'p' AND k.final_parked_at = k.parked_at THEN 'p'
                      WHEN k.status = 'r' THEN 'r' ELSE 'u' END
    FROM (SELECT b.status FROM idempotency_keys b
          WHERE b.scope = p_scope AND b.idempotency_key = p_key) AS before
    WHERE k.scope = p_scope AND k.idempotency_key = p_key
      AND k.status = ANY ('{r,u,p}'::"char"[]) /* from: verdict */
      AND k.unknown_at IS NOT NULL
      AND (k.status <> 'r' OR v_now - k.locked_at > coalesce(k.lease_us, p_lock_timeout_us)::float8 * interval '1 microsecond')
      AND (k.call_until IS NULL OR k.call_until < v_now)
    RETURNING k.workflow, before.status, k.status, k.recovery_point, k.attempts, k.lock_token
    INTO workflow, v_before, v_after, v_point, v_tries, v_token;
    IF FOUND THEN
        PERFORM atomicphase_key_event(p_scope, p_key, 'resolved', v_before, v_after,
            v_point, v_tries, v_token, NULL);
        recorded := true;
        RETURN NEXT;
        RETURN;
    END IF;
    SELECT k.workflow, false INTO workflow, recorded
    FROM idempotency_keys k
    WHERE k.scope = p_scope AND k.idempotency_key = p_key AND k.status <> 'f'
      AND coalesce(atomicphase_held_until(k.locked_at, k.lease_us, k.call_until, p_lock_timeout_us) < v_now, true);
    IF FOUND THEN
        RETURN NEXT;
    END IF;
END
$function$;
COMMENT ON FUNCTION atomicphase_record_verdict(p_scope text, p_key text, p_happened boolean, p_note text, p_lock_timeout_us bigint, p_result jsonb) IS 'Records a verdict on an unknown outcome with its result, and moves the key as the state table allows.';

-- Raises an error with a code: what a plain statement calls on the branch
-- that refuses, so that its batch ends there.
CREATE OR REPLACE FUNCTION atomicphase_refuse(p_code text, p_message text)
 RETURNS boolean
 LANGUAGE plpgsql
AS $function$
BEGIN
    RAISE EXCEPTION USING ERRCODE = p_code, MESSAGE = p_message;
END
$function$;
COMMENT ON FUNCTION atomicphase_refuse(p_code text, p_message text) IS 'Raises an error with a code: what a plain statement calls on the branch that refuses, so that its batch ends there.';

-- Lets go of a key after a failed attempt: waiting with a backoff, unknown,
-- or parked, with the error in its history.
CREATE OR REPLACE FUNCTION atomicphase_release(p_scope text, p_key text, p_lock_token bigint, p_error text, p_retry_in_us bigint, p_park boolean, p_unknown boolean)
 RETURNS SETOF boolean
 LANGUAGE sql
AS $function$
    SELECT r FROM atomicphase_release(
        p_scope, p_key, p_lock_token, p_error, p_retry_in_us, p_park, p_unknown, false, p_park) AS r
$function$;
COMMENT ON FUNCTION atomicphase_release(p_scope text, p_key text, p_lock_token bigint, p_error text, p_retry_in_us bigint, p_park boolean, p_unknown boolean) IS 'Lets go of a key after a failed attempt: waiting with a backoff, unknown, or parked, with the error in its history.';

-- Lets go of a key after a failed attempt: waiting with a backoff, unknown,
-- or parked, with the error in its history.
CREATE OR REPLACE FUNCTION atomicphase_release(p_scope text, p_key text, p_lock_token bigint, p_error text, p_retry_in_us bigint, p_park boolean, p_unknown boolean, p_final boolean)
 RETURNS SETOF boolean
 LANGUAGE sql
AS $function$
    SELECT r FROM atomicphase_release(
        p_scope, p_key, p_lock_token, p_error, p_retry_in_us, p_park, p_unknown, p_final, p_park) AS r
$function$;
COMMENT ON FUNCTION atomicphase_release(p_scope text, p_key text, p_lock_token bigint, p_error text, p_retry_in_us bigint, p_park boolean, p_unknown boolean, p_final boolean) IS 'Lets go of a key after a failed attempt: waiting with a backoff, unknown, or parked, with the error in its history.';

-- Lets go of a key after a failed attempt: waiting with a backoff, unknown,
-- or parked, with the error in its history.
CREATE OR REPLACE FUNCTION atomicphase_release(p_scope text, p_key text, p_lock_token bigint, p_error text, p_retry_in_us bigint, p_park boolean, p_unknown boolean, p_final boolean, p_called boolean)
 RETURNS SETOF boolean
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_now    timestamptz := now();
    v_next   timestamptz := v_now + p_retry_in_us::float8 * interval '1 microsecond';
    v_before "char";
    v_after  "char";
    v_point  text;
    v_tries  integer;
BEGIN
    UPDATE idempotency_keys AS k SET
        locked_at = NULL,
        updated_at = v_now,
        last_error = coalesce(p_error, k.last_error),
        next_attempt_at = CASE WHEN p_retry_in_us IS NULL THEN k.next_attempt_at ELSE v_next END,
        parked_at = CASE WHEN p_park THEN v_now ELSE k.parked_at END,
        final_parked_at = CASE WHEN p_park AND p_final THEN v_now ELSE k.final_parked_at END,
        unknown_at = CASE WHEN p_unknown THEN coalesce(k.unknown_at, v_now) ELSE k.unknown_at END,
        called_at = CASE WHEN p_called THEN coalesce(k.called_at, v_now) ELSE k.called_at END,
        status = CASE WHEN p_park OR k.status = 'p' THEN 'p'
                      WHEN p_unknown OR k.unknown_at IS NOT NULL THEN 'u' ELSE 'w' END
    FROM (SELECT b.status FROM idempotency_keys b
          WHERE b.scope = p_scope AND b.idempotency_key = p_key) AS before
    WHERE k.scope = p_scope AND k.idempotency_key = p_key AND k.lock_token = p_lock_token
      AND k.status = ANY ('{r,w,u,p}'::"char"[]) /* from: run */
    RETURNING before.status, k.status, k.recovery_point, k.attempts INTO v_before, v_after, v_point, v_tries;
    IF FOUND THEN
        IF v_before <> v_after THEN
            PERFORM atomicphase_key_event(p_scope, p_key, NULL, v_before, v_after,
                v_point, v_tries, p_lock_token, CASE WHEN v_before = 'r' THEN p_error END);
        END IF;
        RETURN NEXT true;
    END IF;
END
$function$;
COMMENT ON FUNCTION atomicphase_release(p_scope text, p_key text, p_lock_token bigint, p_error text, p_retry_in_us bigint, p_park boolean, p_unknown boolean, p_final boolean, p_called boolean) IS 'Lets go of a key after a failed attempt: waiting with a backoff, unknown, or parked, with the error in its history.';

-- Renews a running key's lease and marks its foreign call.
CREATE OR REPLACE FUNCTION atomicphase_renew(p_scope text, p_key text, p_lock_token bigint, p_lease_us bigint, p_call_us bigint)
 RETURNS SETOF boolean
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_now  timestamptz := now();
    v_call timestamptz := v_now + p_call_us::float8 * interval '1 microsecond';
BEGIN
    UPDATE idempotency_keys AS k
    SET locked_at = v_now, lease_us = p_lease_us,
        call_until = CASE WHEN p_call_us IS NULL THEN k.call_until ELSE v_call END
    WHERE k.scope = p_scope AND k.idempotency_key = p_key AND k.lock_token = p_lock_token
      AND k.status = 'r' /* from: run */;
    IF FOUND THEN
        RETURN NEXT true;
    END IF;
END
$function$;
COMMENT ON FUNCTION atomicphase_renew(p_scope text, p_key text, p_lock_token bigint, p_lease_us bigint, p_call_us bigint) IS 'Renews a running key''s lease and marks its foreign call.';

-- Makes a key due now: an unparked key with a fresh budget of attempts, or
-- another's backoff cleared.
CREATE OR REPLACE FUNCTION atomicphase_schedule(p_scope text, p_key text, p_unpark boolean)
 RETURNS SETOF boolean
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_now   timestamptz := now();
    v_after "char";
    v_point text;
    v_token bigint;
BEGIN
    UPDATE idempotency_keys AS k
    SET parked_at = NULL, next_attempt_at = v_now, updated_at = v_now,
        attempts = CASE WHEN p_unpark THEN 1 ELSE k.attempts END,
        status = CASE WHEN NOT p_unpark THEN k.status WHEN k.unknown_at IS NOT NULL THEN 'u' ELSE 'w' END
    WHERE k.scope = p_scope AND k.idempotency_key = p_key
      AND k.status = ANY (CASE WHEN p_unpark THEN '{p}'::"char"[] /* from: unpark */
                               ELSE '{r,w,u}'::"char"[] /* from: due */ END)
    RETURNING k.status, k.recovery_point, k.lock_token INTO v_after, v_point, v_token;
    IF FOUND THEN
        IF p_unpark THEN
            PERFORM atomicphase_key_event(p_scope, p_key, 'unparked', 'p', v_after,
                v_point, 1, v_token, NULL);
        END IF;
        RETURN NEXT true;
    END IF;
END
$function$;
COMMENT ON FUNCTION atomicphase_schedule(p_scope text, p_key text, p_unpark boolean) IS 'Makes a key due now: an unparked key with a fresh budget of attempts, or another''s backoff cleared.';

-- The cutoff before which a lock is stale (a previous release's rule).
CREATE OR REPLACE FUNCTION atomicphase_stale_before(p_lock_timeout_us bigint)
 RETURNS timestamp with time zone
 LANGUAGE sql
 STABLE PARALLEL SAFE
AS $function$
    SELECT now() - p_lock_timeout_us * interval '1 microsecond'
$function$;
COMMENT ON FUNCTION atomicphase_stale_before(p_lock_timeout_us bigint) IS 'The cutoff before which a lock is stale (a previous release''s rule).';

-- A state's name (running, waiting, unknown, parked, finished) from its
-- letter.
CREATE OR REPLACE FUNCTION atomicphase_state_name(p_status "char")
 RETURNS text
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
    -- A searched CASE: Citus deparses a simple one (CASE p_status WHEN …),
    -- inlined into a statement it sends a worker, into a comparison of
    -- "char" with boolean, which fails there.
    SELECT CASE WHEN p_status = 'r' THEN 'running' WHEN p_status = 'w' THEN 'waiting'
                WHEN p_status = 'u' THEN 'unknown' WHEN p_status = 'p' THEN 'parked'
                WHEN p_status = 'f' THEN 'finished' END
$function$;
COMMENT ON FUNCTION atomicphase_state_name(p_status "char") IS 'A state''s name (running, waiting, unknown, parked, finished) from its letter.';

-- Takes a key nobody holds, for Resume, the sweep or a verdict's resolution.
CREATE OR REPLACE FUNCTION atomicphase_take(p_scope text, p_key text, p_lock_timeout_us bigint, p_lock_token bigint, p_sweep boolean)
 RETURNS TABLE(workflow text, recovery_point text, next_phase text, state bytea, lock_token bigint, downstream_salt uuid, attempts integer, took_over boolean)
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_now    timestamptz := now();
    v_before "char";
BEGIN
    UPDATE idempotency_keys AS k
    SET locked_at = v_now, lock_token = p_lock_token, updated_at = v_now, parked_at = NULL,
        next_attempt_at = v_now, attempts = k.attempts + 1, lease_us = p_lock_timeout_us, status = 'r'
    FROM (SELECT b.status FROM idempotency_keys b
          WHERE b.scope = p_scope AND b.idempotency_key = p_key) AS before
    WHERE k.scope = p_scope AND k.idempotency_key = p_key
      AND k.status = ANY (CASE WHEN p_sweep THEN '{r,w,u}'::"char"[] /* from: sweep */
                               ELSE '{r,w,u,p}'::"char"[] /* from: resume */ END)
      AND (k.status <> 'r' OR v_now - k.locked_at > coalesce(k.lease_us, p_lock_timeout_us)::float8 * interval '1 microsecond')
      AND (k.call_until IS NULL OR k.call_until < v_now)
      AND (p_sweep IS NOT TRUE OR k.next_attempt_at IS NULL OR k.next_attempt_at <= v_now)
    RETURNING k.workflow, k.recovery_point, k.next_phase, k.state, k.lock_token,
              k.downstream_salt, k.attempts, before.status = 'r', before.status
    INTO workflow, recovery_point, next_phase, state, lock_token,
         downstream_salt, attempts, took_over, v_before;
    IF FOUND THEN
        PERFORM atomicphase_key_event(p_scope, p_key,
            CASE WHEN took_over THEN 'taken_over' END, v_before, 'r',
            recovery_point, attempts, p_lock_token, NULL);
        RETURN NEXT;
    END IF;
END
$function$;
COMMENT ON FUNCTION atomicphase_take(p_scope text, p_key text, p_lock_timeout_us bigint, p_lock_token bigint, p_sweep boolean) IS 'Takes a key nobody holds, for Resume, the sweep or a verdict''s resolution.';

-- Unparks a key (a previous release's Unpark).
CREATE OR REPLACE FUNCTION atomicphase_unpark(p_scope text, p_key text)
 RETURNS SETOF boolean
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_now    timestamptz := now();
    v_before "char";
    v_after  "char";
    v_point  text;
    v_token  bigint;
BEGIN
    UPDATE idempotency_keys AS k
    SET parked_at = NULL, next_attempt_at = v_now, updated_at = v_now, attempts = 1,
        status = CASE WHEN k.status <> 'p' THEN k.status WHEN k.unknown_at IS NOT NULL THEN 'u' ELSE 'w' END
    FROM (SELECT b.status FROM idempotency_keys b
          WHERE b.scope = p_scope AND b.idempotency_key = p_key) AS before
    WHERE k.scope = p_scope AND k.idempotency_key = p_key
      AND (k.status = 'p' /* from: unpark */ OR k.status = ANY ('{r,w,u}'::"char"[]) /* from: due */)
    RETURNING before.status, k.status, k.recovery_point, k.lock_token INTO v_before, v_after, v_point, v_token;
    IF FOUND THEN
        IF v_before = 'p' THEN
            PERFORM atomicphase_key_event(p_scope, p_key, 'unparked', v_before, v_after,
                v_point, 1, v_token, NULL);
        END IF;
        RETURN NEXT true;
    END IF;
END
$function$;
COMMENT ON FUNCTION atomicphase_unpark(p_scope text, p_key text) IS 'Unparks a key (a previous release''s Unpark).';

-- The key table's DELETE guard

CREATE TRIGGER atomicphase_key_delete AFTER DELETE ON idempotency_keys FOR EACH ROW WHEN (((old.status <> 'f'::"char") OR (old.attempts > 1) OR (old.resolved_at IS NOT NULL))) EXECUTE FUNCTION atomicphase_key_delete();

-- The migrations this file stands for, recorded as applied

INSERT INTO atomicphase_migration (version, name) VALUES
    (1, 'idempotency_keys'),
    (2, 'stale_lock_rule'),
    (3, 'trust'),
    (4, 'operations'),
    (5, 'unknown_outcomes'),
    (6, 'one_clock'),
    (7, 'leases'),
    (8, 'errors'),
    (9, 'console'),
    (10, 'parked_indexes'),
    (11, 'workflow_versions'),
    (12, 'record_with_unit'),
    (13, 'acquire_on_citus'),
    (14, 'take_on_citus'),
    (15, 'called'),
    (16, 'sweep_watermark'),
    (17, 'key_state'),
    (18, 'hot_finish'),
    (19, 'record_first'),
    (20, 'drop_request_indexes');
