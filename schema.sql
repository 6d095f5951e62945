-- The complete current atomicphase schema, for projects that apply schema
-- with their own migration tool. Migrate applies the same SQL from the
-- numbered files in migration/; a test keeps the two identical. Apply it
-- statement by statement (psql -f schema.sql does), not in one
-- transaction: its concurrent index builds cannot run inside one.

-- One row per (scope, idempotency key): the request's fingerprint, where its
-- workflow stands (recovery point and state), who holds it (lock token and
-- time), and, once finished, the response to replay.
CREATE TABLE idempotency_keys (
    scope           text        NOT NULL,
    idempotency_key text        NOT NULL,
    workflow        text        NOT NULL,
    fingerprint     bytea       NOT NULL,
    request_method  text        NOT NULL,
    request_path    text        NOT NULL,
    recovery_point  text        NOT NULL DEFAULT 'started',
    -- Set when the last committed phase jumped: the phase to run next.
    next_phase      text,
    state           jsonb       NOT NULL,
    -- Renewed by every acquisition; every phase commit checks it (fencing).
    lock_token      bigint      NOT NULL DEFAULT 1,
    -- NULL when nobody holds the key; refreshed by every phase commit.
    locked_at       timestamptz,
    response_status integer,
    response_header jsonb,
    response_body   bytea,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz,
    PRIMARY KEY (scope, idempotency_key),
    CONSTRAINT idempotency_keys_finished_has_response
        CHECK ((recovery_point = 'finished') = (response_status IS NOT NULL))
);

-- For reaping old keys by age.
CREATE INDEX idempotency_keys_created_at_idx ON idempotency_keys (created_at);

-- atomicphase_acquire decides every case of an arriving request in one
-- statement and one round trip. A finished key (replay), another
-- fingerprint, or a live lock is answered by the primary-key read alone:
-- nothing is built, written or drawn. A new key, or an unfinished key that
-- is unlocked or whose lock is older than the lock timeout, goes through one
-- stale-lock-aware upsert that records it (or takes it over, renewing its
-- lock token) and returns where it stands. The upsert re-checks its WHERE
-- against the newest row version, so of two attempts racing for a key only
-- one gets it; the loser reads the row again and reports what it finds.
CREATE FUNCTION atomicphase_acquire(
    p_scope text, p_key text, p_workflow text, p_fingerprint bytea,
    p_method text, p_path text, p_state jsonb, p_lock_timeout_us bigint,
    OUT acquired boolean, OUT workflow text, OUT fingerprint bytea,
    OUT recovery_point text, OUT next_phase text, OUT state jsonb,
    OUT lock_token bigint, OUT lock_expires_in float8,
    OUT response_status integer, OUT response_header jsonb, OUT response_body bytea
) LANGUAGE plpgsql AS $$
DECLARE
    stale_before timestamptz := now() - p_lock_timeout_us * interval '1 microsecond';
    held_since   timestamptz;
BEGIN
    acquired := false;
    FOR round IN 1..2 LOOP
        SELECT k.workflow, k.fingerprint, k.recovery_point, k.next_phase, k.lock_token,
               k.locked_at, k.response_status, k.response_header, k.response_body
        INTO workflow, fingerprint, recovery_point, next_phase, lock_token,
             held_since, response_status, response_header, response_body
        FROM idempotency_keys k
        WHERE k.scope = p_scope AND k.idempotency_key = p_key;
        IF FOUND AND (response_status IS NOT NULL OR workflow <> p_workflow
                      OR fingerprint <> p_fingerprint OR held_since >= stale_before) THEN
            lock_expires_in := extract(epoch FROM held_since - stale_before)::float8;
            RETURN;
        END IF;

        INSERT INTO idempotency_keys AS k
            (scope, idempotency_key, workflow, fingerprint, request_method, request_path, state, locked_at)
        VALUES (p_scope, p_key, p_workflow, p_fingerprint, p_method, p_path, p_state, now())
        ON CONFLICT (scope, idempotency_key) DO UPDATE
            SET locked_at = now(), lock_token = k.lock_token + 1, updated_at = now()
            WHERE k.response_status IS NULL AND k.workflow = p_workflow
              AND k.fingerprint = p_fingerprint
              AND (k.locked_at IS NULL OR k.locked_at < stale_before)
        RETURNING k.workflow, k.fingerprint, k.recovery_point, k.next_phase, k.state, k.lock_token
        INTO workflow, fingerprint, recovery_point, next_phase, state, lock_token;
        IF FOUND THEN
            acquired := true;
            response_status := NULL;
            response_header := NULL;
            response_body := NULL;
            RETURN;
        END IF;
        -- Another attempt took the key between the read and the upsert.
    END LOOP;
    -- Contended twice in a row: report the key as held, to be retried.
    workflow := p_workflow;
    fingerprint := p_fingerprint;
    recovery_point := 'started';
    lock_token := 0;
    lock_expires_in := 0;
END
$$;

-- atomicphase_checkpoint commits a phase's recovery point, state and (for the
-- last phase) response, but only while the caller still holds the lock token.
-- It raises SQLSTATE AP001 otherwise, so a pipelined COMMIT after it never
-- runs and the phase's own writes roll back with it: that is the fencing.
CREATE FUNCTION atomicphase_checkpoint(
    p_scope text, p_key text, p_lock_token bigint,
    p_recovery_point text, p_next_phase text, p_state jsonb,
    p_status integer, p_header jsonb, p_body bytea
) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE idempotency_keys SET
        recovery_point  = p_recovery_point,
        next_phase      = p_next_phase,
        state           = p_state,
        locked_at       = CASE WHEN p_status IS NULL THEN clock_timestamp() END,
        response_status = p_status,
        response_header = p_header,
        response_body   = p_body,
        finished_at     = CASE WHEN p_status IS NOT NULL THEN clock_timestamp() END,
        updated_at      = clock_timestamp()
    WHERE scope = p_scope
      AND idempotency_key = p_key
      AND lock_token = p_lock_token
      AND response_status IS NULL;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'idempotency key % lost its lock to a newer attempt', p_key
            USING ERRCODE = 'AP001';
    END IF;
END
$$;

-- The stale-lock rule, written once. A key's lock goes stale when it is
-- older than the lock timeout; an unfinished key may be taken by the next
-- attempt when it is unlocked or its lock is stale. Acquisition, Resume and
-- Inspect all ask these two functions. Both are plain SQL functions, which
-- PostgreSQL inlines into the statements that call them, so writing the rule
-- once costs nothing per call.
CREATE FUNCTION atomicphase_stale_before(p_lock_timeout_us bigint)
RETURNS timestamptz LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT now() - p_lock_timeout_us * interval '1 microsecond'
$$;

CREATE FUNCTION atomicphase_lock_takeable(p_locked_at timestamptz, p_stale_before timestamptz)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT p_locked_at IS NULL OR p_locked_at < p_stale_before
$$;

-- atomicphase_acquire decides every case of an arriving request in one
-- statement and one round trip. A finished key (replay), another
-- fingerprint, or a live lock is answered by the primary-key read alone:
-- nothing is built, written or drawn. A new key, or an unfinished key that
-- is unlocked or whose lock is older than the lock timeout, goes through one
-- stale-lock-aware upsert that records it (or takes it over, renewing its
-- lock token) and returns where it stands. The upsert re-checks its WHERE
-- against the newest row version, so of two attempts racing for a key only
-- one gets it; the loser reads the row again and reports what it finds.
CREATE OR REPLACE FUNCTION atomicphase_acquire(
    p_scope text, p_key text, p_workflow text, p_fingerprint bytea,
    p_method text, p_path text, p_state jsonb, p_lock_timeout_us bigint,
    OUT acquired boolean, OUT workflow text, OUT fingerprint bytea,
    OUT recovery_point text, OUT next_phase text, OUT state jsonb,
    OUT lock_token bigint, OUT lock_expires_in float8,
    OUT response_status integer, OUT response_header jsonb, OUT response_body bytea
) LANGUAGE plpgsql AS $$
DECLARE
    stale_before timestamptz := atomicphase_stale_before(p_lock_timeout_us);
    held_since   timestamptz;
BEGIN
    acquired := false;
    FOR round IN 1..2 LOOP
        SELECT k.workflow, k.fingerprint, k.recovery_point, k.next_phase, k.lock_token,
               k.locked_at, k.response_status, k.response_header, k.response_body
        INTO workflow, fingerprint, recovery_point, next_phase, lock_token,
             held_since, response_status, response_header, response_body
        FROM idempotency_keys k
        WHERE k.scope = p_scope AND k.idempotency_key = p_key;
        IF FOUND AND (response_status IS NOT NULL OR workflow <> p_workflow
                      OR fingerprint <> p_fingerprint
                      OR NOT atomicphase_lock_takeable(held_since, stale_before)) THEN
            lock_expires_in := extract(epoch FROM held_since - stale_before)::float8;
            RETURN;
        END IF;

        INSERT INTO idempotency_keys AS k
            (scope, idempotency_key, workflow, fingerprint, request_method, request_path, state, locked_at)
        VALUES (p_scope, p_key, p_workflow, p_fingerprint, p_method, p_path, p_state, now())
        ON CONFLICT (scope, idempotency_key) DO UPDATE
            SET locked_at = now(), lock_token = k.lock_token + 1, updated_at = now()
            WHERE k.response_status IS NULL AND k.workflow = p_workflow
              AND k.fingerprint = p_fingerprint
              AND atomicphase_lock_takeable(k.locked_at, stale_before)
        RETURNING k.workflow, k.fingerprint, k.recovery_point, k.next_phase, k.state, k.lock_token
        INTO workflow, fingerprint, recovery_point, next_phase, state, lock_token;
        IF FOUND THEN
            acquired := true;
            response_status := NULL;
            response_header := NULL;
            response_body := NULL;
            RETURN;
        END IF;
        -- Another attempt took the key between the read and the upsert.
    END LOOP;
    -- Contended twice in a row: report the key as held, to be retried.
    workflow := p_workflow;
    fingerprint := p_fingerprint;
    recovery_point := 'started';
    lock_token := 0;
    lock_expires_in := 0;
END
$$;

-- The state is stored verbatim (bytea), so a phase resumed after a crash sees
-- the very bytes the first attempt committed: jsonb would reorder members,
-- respace and respell numbers. A finished key keeps no state (NULL) unless
-- its workflow asks to.
ALTER TABLE idempotency_keys
    ALTER COLUMN state DROP NOT NULL,
    ALTER COLUMN state TYPE bytea USING convert_to(state::text, 'UTF8'),
    -- Salts the downstream keys of this row: stable for every retry of the
    -- row, new for a new row under the same client key (after the old one
    -- was deleted), so an old downstream result is never re-linked. Rows
    -- recorded before this migration keep NULL, and with it the downstream
    -- keys they already sent.
    ADD COLUMN downstream_salt uuid,
    -- Set when the key failed in a way no retry of the same code can fix;
    -- last_error says why. A parked key is unlocked: a client retry resumes
    -- it, and taking it clears the mark.
    ADD COLUMN parked_at timestamptz,
    ADD COLUMN last_error text;

ALTER TABLE idempotency_keys
    ALTER COLUMN downstream_salt SET DEFAULT gen_random_uuid();

DROP FUNCTION atomicphase_acquire(text, text, text, bytea, text, text, jsonb, bigint);
DROP FUNCTION atomicphase_checkpoint(text, text, bigint, text, text, jsonb, integer, jsonb, bytea);

-- atomicphase_acquire decides every case of an arriving request in one
-- statement and one round trip. A finished key (replay), another
-- fingerprint, or a live lock is answered by the primary-key read alone:
-- nothing is built, written or drawn. A new key, or an unfinished key that
-- is unlocked or whose lock is stale, goes through one stale-lock-aware
-- upsert that records it (or takes it over) under the caller's lock token
-- and returns where it stands. The caller draws the token at random before
-- the call, so it knows the token even when the answer is lost and can
-- unlock by it. The upsert re-checks its WHERE against the newest row
-- version, so of two attempts racing for a key only one gets it; the loser
-- reads the row again and reports what it finds. The time is read once into
-- a variable: no volatile or stable function is evaluated per row.
CREATE FUNCTION atomicphase_acquire(
    p_scope text, p_key text, p_workflow text, p_fingerprint bytea,
    p_method text, p_path text, p_state bytea, p_lock_timeout_us bigint,
    p_lock_token bigint,
    OUT acquired boolean, OUT workflow text, OUT fingerprint bytea,
    OUT recovery_point text, OUT next_phase text, OUT state bytea,
    OUT lock_token bigint, OUT lock_expires_in float8, OUT downstream_salt uuid,
    OUT response_status integer, OUT response_header jsonb, OUT response_body bytea
) LANGUAGE plpgsql AS $$
DECLARE
    v_now        timestamptz := now();
    stale_before timestamptz := atomicphase_stale_before(p_lock_timeout_us);
    held_since   timestamptz;
BEGIN
    acquired := false;
    FOR round IN 1..2 LOOP
        SELECT k.workflow, k.fingerprint, k.recovery_point, k.next_phase, k.lock_token,
               k.locked_at, k.response_status, k.response_header, k.response_body
        INTO workflow, fingerprint, recovery_point, next_phase, lock_token,
             held_since, response_status, response_header, response_body
        FROM idempotency_keys k
        WHERE k.scope = p_scope AND k.idempotency_key = p_key;
        IF FOUND AND (response_status IS NOT NULL OR workflow <> p_workflow
                      OR fingerprint <> p_fingerprint
                      OR NOT atomicphase_lock_takeable(held_since, stale_before)) THEN
            lock_expires_in := extract(epoch FROM held_since - stale_before)::float8;
            RETURN;
        END IF;

        INSERT INTO idempotency_keys AS k
            (scope, idempotency_key, workflow, fingerprint, request_method, request_path,
             state, lock_token, locked_at)
        VALUES (p_scope, p_key, p_workflow, p_fingerprint, p_method, p_path,
                p_state, p_lock_token, v_now)
        ON CONFLICT (scope, idempotency_key) DO UPDATE
            SET locked_at = v_now, lock_token = p_lock_token, updated_at = v_now,
                parked_at = NULL
            WHERE k.response_status IS NULL AND k.workflow = p_workflow
              AND k.fingerprint = p_fingerprint
              AND atomicphase_lock_takeable(k.locked_at, stale_before)
        RETURNING k.workflow, k.fingerprint, k.recovery_point, k.next_phase, k.state,
                  k.lock_token, k.downstream_salt
        INTO workflow, fingerprint, recovery_point, next_phase, state,
             lock_token, downstream_salt;
        IF FOUND THEN
            acquired := true;
            response_status := NULL;
            response_header := NULL;
            response_body := NULL;
            RETURN;
        END IF;
        -- Another attempt took the key between the read and the upsert.
    END LOOP;
    -- Contended twice in a row: report the key as held, with no expiry
    -- known, so the caller gets the default retry-after.
    workflow := p_workflow;
    fingerprint := p_fingerprint;
    recovery_point := 'started';
    lock_token := 0;
    lock_expires_in := NULL;
END
$$;

-- atomicphase_checkpoint commits a phase's recovery point, state and (for the
-- last phase) response, but only while the caller still holds the lock token.
-- It raises SQLSTATE AP001 otherwise, so a pipelined COMMIT after it never
-- runs and the phase's own writes roll back with it: that is the fencing.
CREATE FUNCTION atomicphase_checkpoint(
    p_scope text, p_key text, p_lock_token bigint,
    p_recovery_point text, p_next_phase text, p_state bytea,
    p_status integer, p_header jsonb, p_body bytea
) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
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
        updated_at      = v_now
    WHERE scope = p_scope
      AND idempotency_key = p_key
      AND lock_token = p_lock_token
      AND response_status IS NULL;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'idempotency key % lost its lock to a newer attempt', p_key
            USING ERRCODE = 'AP001';
    END IF;
END
$$;

-- The key's life, visible in its row: how many attempts took it, when the
-- background sweep may try it next (NULL: as soon as it is takeable), and
-- (from migration 003) why the last attempt failed and whether the key is
-- parked for an operator.
ALTER TABLE idempotency_keys
    ADD COLUMN attempts integer NOT NULL DEFAULT 1,
    ADD COLUMN next_attempt_at timestamptz;

-- The sweep's two queries: unfinished keys due for a try (those in backoff
-- sort last, so an outage's backlog costs the sweep nothing until it is
-- due), and finished keys past their retention. And the per-scope count of
-- unfinished keys, for Config.MaxUnfinishedPerScope.
CREATE INDEX idempotency_keys_due_idx ON idempotency_keys (next_attempt_at NULLS FIRST)
    WHERE response_status IS NULL AND parked_at IS NULL;
CREATE INDEX idempotency_keys_unfinished_scope_idx ON idempotency_keys (scope)
    WHERE response_status IS NULL AND parked_at IS NULL;
CREATE INDEX idempotency_keys_finished_at_idx ON idempotency_keys (finished_at)
    WHERE response_status IS NOT NULL;

DROP FUNCTION atomicphase_acquire(text, text, text, bytea, text, text, bytea, bigint, bigint);

-- atomicphase_acquire decides every case of an arriving request in one
-- statement and one round trip. A finished key (replay), another
-- fingerprint, or a live lock is answered by the primary-key read alone:
-- nothing is built, written or drawn. A new key, or an unfinished key that
-- is unlocked (parked or not) or whose lock is stale, goes through one
-- stale-lock-aware upsert that records it (or takes it over) under the
-- caller's lock token, counts the attempt, and returns where it stands. The
-- caller draws the token at random before the call, so it knows the token
-- even when the answer is lost and can unlock by it. The upsert re-checks
-- its WHERE against the newest row version, so of two attempts racing for a
-- key only one gets it; the loser reads the row again and reports what it
-- finds. When p_max_unfinished is set, a new key is refused (over_limit)
-- while its scope already has that many unfinished keys. The time is read
-- once into a variable: no volatile or stable function is evaluated per row.
CREATE FUNCTION atomicphase_acquire(
    p_scope text, p_key text, p_workflow text, p_fingerprint bytea,
    p_method text, p_path text, p_state bytea, p_lock_timeout_us bigint,
    p_lock_token bigint, p_max_unfinished integer,
    OUT acquired boolean, OUT workflow text, OUT fingerprint bytea,
    OUT recovery_point text, OUT next_phase text, OUT state bytea,
    OUT lock_token bigint, OUT lock_expires_in float8, OUT downstream_salt uuid,
    OUT attempts integer, OUT took_over boolean, OUT over_limit boolean,
    OUT response_status integer, OUT response_header jsonb, OUT response_body bytea
) LANGUAGE plpgsql AS $$
DECLARE
    v_now        timestamptz := now();
    stale_before timestamptz := atomicphase_stale_before(p_lock_timeout_us);
    held_since   timestamptz;
BEGIN
    acquired := false;
    took_over := false;
    over_limit := false;
    attempts := 0;
    FOR round IN 1..2 LOOP
        SELECT k.workflow, k.fingerprint, k.recovery_point, k.next_phase, k.lock_token,
               k.locked_at, k.attempts, k.response_status, k.response_header, k.response_body
        INTO workflow, fingerprint, recovery_point, next_phase, lock_token,
             held_since, attempts, response_status, response_header, response_body
        FROM idempotency_keys k
        WHERE k.scope = p_scope AND k.idempotency_key = p_key;
        IF FOUND AND (response_status IS NOT NULL OR workflow <> p_workflow
                      OR fingerprint <> p_fingerprint
                      OR NOT atomicphase_lock_takeable(held_since, stale_before)) THEN
            lock_expires_in := extract(epoch FROM held_since - stale_before)::float8;
            RETURN;
        END IF;
        took_over := FOUND AND held_since IS NOT NULL;
        IF NOT FOUND AND p_max_unfinished IS NOT NULL AND p_max_unfinished <= (
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
             state, lock_token, locked_at)
        VALUES (p_scope, p_key, p_workflow, p_fingerprint, p_method, p_path,
                p_state, p_lock_token, v_now)
        ON CONFLICT (scope, idempotency_key) DO UPDATE
            SET locked_at = v_now, lock_token = p_lock_token, updated_at = v_now,
                attempts = k.attempts + 1, parked_at = NULL, next_attempt_at = NULL
            WHERE k.response_status IS NULL AND k.workflow = p_workflow
              AND k.fingerprint = p_fingerprint
              AND atomicphase_lock_takeable(k.locked_at, stale_before)
        RETURNING k.workflow, k.fingerprint, k.recovery_point, k.next_phase, k.state,
                  k.lock_token, k.downstream_salt, k.attempts
        INTO workflow, fingerprint, recovery_point, next_phase, state,
             lock_token, downstream_salt, attempts;
        IF FOUND THEN
            acquired := true;
            response_status := NULL;
            response_header := NULL;
            response_body := NULL;
            RETURN;
        END IF;
        -- Another attempt took the key between the read and the upsert.
        took_over := false;
    END LOOP;
    -- Contended twice in a row: report the key as held, with no expiry
    -- known, so the caller gets the default retry-after.
    workflow := p_workflow;
    fingerprint := p_fingerprint;
    recovery_point := 'started';
    lock_token := 0;
    attempts := 0;
    lock_expires_in := NULL;
END
$$;

-- Unknown outcomes. A foreign call to a downstream without idempotency keys
-- that failed (a timeout, a lost answer, a 5xx that may have executed) may
-- or may not have taken effect; until reconciliation tells, the key is
-- marked with when that became unknown, and next_attempt_at says when to
-- reconcile. The checkpoint that commits the phase clears the mark.
--
-- An operator can settle an unknown outcome by hand (the CLI's resolve):
-- the verdict is recorded in the row, for the phase after the recovery
-- point it was given at (resolved_after), and the next attempt that resumes
-- into that phase takes it (clearing resolved_after) instead of asking the
-- reconcile function. resolved_happened, resolved_note and resolved_at stay
-- as the record of what was decided.
ALTER TABLE idempotency_keys
    ADD COLUMN unknown_at timestamptz,
    ADD COLUMN resolved_after text,
    ADD COLUMN resolved_happened boolean,
    ADD COLUMN resolved_note text,
    ADD COLUMN resolved_at timestamptz;

-- atomicphase_checkpoint commits a phase's recovery point, state and (for the
-- last phase) response, but only while the caller still holds the lock token.
-- It raises SQLSTATE AP001 otherwise, so a pipelined COMMIT after it never
-- runs and the phase's own writes roll back with it: that is the fencing.
CREATE OR REPLACE FUNCTION atomicphase_checkpoint(
    p_scope text, p_key text, p_lock_token bigint,
    p_recovery_point text, p_next_phase text, p_state bytea,
    p_status integer, p_header jsonb, p_body bytea
) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
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
        updated_at      = v_now
    WHERE scope = p_scope
      AND idempotency_key = p_key
      AND lock_token = p_lock_token
      AND response_status IS NULL;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'idempotency key % lost its lock to a newer attempt', p_key
            USING ERRCODE = 'AP001';
    END IF;
END
$$;

-- One clock. Every time the key table keeps (locked_at above all, and
-- created_at, updated_at, finished_at, next_attempt_at, parked_at,
-- unknown_at, resolved_at) is written by one of these functions, and
-- atomicphase_acquire and atomicphase_checkpoint, each of which reads the
-- time once into a variable on the node that runs it; every statement that
-- compares a lock time with the present is such a function or a plain
-- SELECT. On one PostgreSQL that is the server's clock. On Citus, with the
-- key table distributed by scope and the functions by p_scope
-- (docs/scale.md), each function runs on the worker that holds the key's
-- row, and a SELECT's now() is evaluated there too: a key's lock is written
-- and judged by one clock, its own node's. (A time computed inside an
-- INSERT, UPDATE or DELETE sent through the coordinator would be the
-- coordinator's: Citus evaluates such expressions before routing the
-- statement, and refuses a stable or volatile function applied to a
-- column.) The statements themselves are the ones the Runner sent before.

-- atomicphase_record records a new key, locked under the caller's lock
-- token, inside the transaction of the workflow's first phase (phase
-- fusion), and returns its downstream salt. It returns no row when the key
-- exists (having waited for an attempt recording it at the same moment to
-- commit or roll back) or, with p_max_unfinished set, while the key's scope
-- already has that many unfinished keys; the caller then acquires the key
-- with atomicphase_acquire, which explains why.
CREATE FUNCTION atomicphase_record(
    p_scope text, p_key text, p_workflow text, p_fingerprint bytea,
    p_method text, p_path text, p_state bytea, p_lock_token bigint,
    p_max_unfinished integer
) RETURNS TABLE (downstream_salt uuid) LANGUAGE plpgsql AS $$
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
$$;

-- atomicphase_take takes an unfinished key that is unlocked or stale,
-- without a request at hand, under the caller's lock token, and returns
-- where it stands; no row when the key is finished, held, or absent. With
-- p_sweep it also re-checks what made the key due when the sweep picked it:
-- not parked, past its backoff. took_over says whether a stale lock was
-- taken (rather than an unlocked key).
CREATE FUNCTION atomicphase_take(
    p_scope text, p_key text, p_lock_timeout_us bigint, p_lock_token bigint, p_sweep boolean
) RETURNS TABLE (
    workflow text, recovery_point text, next_phase text, state bytea,
    lock_token bigint, downstream_salt uuid, attempts integer, took_over boolean
) LANGUAGE plpgsql AS $$
DECLARE
    v_now        timestamptz := now();
    stale_before timestamptz := atomicphase_stale_before(p_lock_timeout_us);
BEGIN
    UPDATE idempotency_keys AS k
    SET locked_at = v_now, lock_token = p_lock_token, updated_at = v_now, parked_at = NULL,
        next_attempt_at = NULL, attempts = k.attempts + 1
    FROM (SELECT b.locked_at FROM idempotency_keys b
          WHERE b.scope = p_scope AND b.idempotency_key = p_key) AS before
    WHERE k.scope = p_scope AND k.idempotency_key = p_key AND k.response_status IS NULL
      AND atomicphase_lock_takeable(k.locked_at, stale_before)
      AND (p_sweep IS NOT TRUE
           OR (k.parked_at IS NULL AND (k.next_attempt_at IS NULL OR k.next_attempt_at <= v_now)))
    RETURNING k.workflow, k.recovery_point, k.next_phase, k.state, k.lock_token,
              k.downstream_salt, k.attempts, before.locked_at IS NOT NULL
    INTO workflow, recovery_point, next_phase, state, lock_token,
         downstream_salt, attempts, took_over;
    IF FOUND THEN
        RETURN NEXT;
    END IF;
END
$$;

-- atomicphase_release releases a lock the caller holds with p_lock_token,
-- leaving the recovery point where the last committed phase put it, and
-- returns a row (true) when it released one. With p_error it records why
-- the attempt failed and, with p_retry_in_us, when the sweep may try the
-- key again; p_park parks the key for an operator; p_unknown marks the
-- outcome of its foreign call unknown. Like a checkpoint it is fenced by
-- the token: a release by an attempt that lost the key changes nothing.
CREATE FUNCTION atomicphase_release(
    p_scope text, p_key text, p_lock_token bigint,
    p_error text, p_retry_in_us bigint, p_park boolean, p_unknown boolean
) RETURNS SETOF boolean LANGUAGE plpgsql AS $$
DECLARE
    v_now  timestamptz := now();
    v_next timestamptz := v_now + p_retry_in_us * interval '1 microsecond';
BEGIN
    UPDATE idempotency_keys AS k SET
        locked_at = NULL,
        updated_at = v_now,
        last_error = coalesce(p_error, k.last_error),
        next_attempt_at = CASE WHEN p_retry_in_us IS NULL THEN k.next_attempt_at ELSE v_next END,
        parked_at = CASE WHEN p_park THEN v_now ELSE k.parked_at END,
        unknown_at = CASE WHEN p_unknown THEN coalesce(k.unknown_at, v_now) ELSE k.unknown_at END
    WHERE k.scope = p_scope AND k.idempotency_key = p_key AND k.lock_token = p_lock_token
      AND k.response_status IS NULL;
    IF FOUND THEN
        RETURN NEXT true;
    END IF;
END
$$;

-- atomicphase_unpark makes an unfinished key eligible for the next sweep at
-- once: it clears the parked mark and any backoff and gives the key a fresh
-- budget of attempts. Not 0: an acquisition that counts 1 is the one that
-- recorded the key, which no earlier call can precede (unknown outcomes
-- rely on that). It returns a row (true) when the key is unfinished.
CREATE FUNCTION atomicphase_unpark(p_scope text, p_key text)
RETURNS SETOF boolean LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := now();
BEGIN
    UPDATE idempotency_keys AS k
    SET parked_at = NULL, next_attempt_at = NULL, updated_at = v_now, attempts = 1
    WHERE k.scope = p_scope AND k.idempotency_key = p_key AND k.response_status IS NULL;
    IF FOUND THEN
        RETURN NEXT true;
    END IF;
END
$$;

-- atomicphase_record_resolution records an operator's verdict on the
-- foreign call an unfinished key waits on, for the phase after its current
-- recovery point, and makes the key due at once. It returns the key's
-- workflow, or no row when the key is finished, absent, or held by a live
-- attempt.
CREATE FUNCTION atomicphase_record_resolution(
    p_scope text, p_key text, p_happened boolean, p_note text, p_lock_timeout_us bigint
) RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
    v_now        timestamptz := now();
    stale_before timestamptz := atomicphase_stale_before(p_lock_timeout_us);
    v_workflow   text;
BEGIN
    UPDATE idempotency_keys AS k
    SET resolved_after = k.recovery_point, resolved_happened = p_happened, resolved_note = p_note,
        resolved_at = v_now, parked_at = NULL, next_attempt_at = NULL, updated_at = v_now
    WHERE k.scope = p_scope AND k.idempotency_key = p_key AND k.response_status IS NULL
      AND atomicphase_lock_takeable(k.locked_at, stale_before)
    RETURNING k.workflow INTO v_workflow;
    IF FOUND THEN
        RETURN NEXT v_workflow;
    END IF;
END
$$;

-- Leases. A key's lock is a lease that its holder renews while it works:
-- lease_us is the lease's length, written by every acquisition, take,
-- recording and renewal, so that the lease ends at locked_at + lease_us
-- (every statement that sets locked_at renews it, the checkpoint included)
-- and any reader, the CLI included, knows when without configuration. Rows
-- last locked by an older release have no lease_us, and are judged by the
-- reader's lock timeout as before.
--
-- call_until is set while the holder is inside a foreign call: the lease
-- the call was made under, plus the grace the holder allows the downstream
-- to finish a request it received before the call's context ended (see
-- docs/concepts.md, "Leases"). Until then no attempt may take the key,
-- whether its lock was released or went stale: the call may still be in
-- flight, and reconciling or calling again before it lands could pay twice.
-- The checkpoint that records the call's result clears it.
ALTER TABLE idempotency_keys
    ADD COLUMN lease_us bigint,
    ADD COLUMN call_until timestamptz;

-- atomicphase_held_until is when a key stops being held: the end of its
-- lease, or of a foreign call's quiet period, whichever is later; NULL when
-- neither is set. A key whose held_until is NULL or past may be taken.
-- A plain SQL function, inlined into the statements that call it.
CREATE FUNCTION atomicphase_held_until(
    p_locked_at timestamptz, p_lease_us bigint, p_call_until timestamptz, p_lock_timeout_us bigint
) RETURNS timestamptz LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT greatest(p_locked_at + coalesce(p_lease_us, p_lock_timeout_us) * interval '1 microsecond', p_call_until)
$$;

-- atomicphase_lock_expires is when a key's holding next changes, as a
-- refusal reports it (the Retry-After of a key in progress): the end of the
-- lease while it runs, or once it has ended (or when the key is unlocked),
-- the end of a foreign call's quiet period still to come. NULL when neither
-- is set.
CREATE FUNCTION atomicphase_lock_expires(
    p_locked_at timestamptz, p_lease_us bigint, p_call_until timestamptz, p_lock_timeout_us bigint,
    p_now timestamptz
) RETURNS timestamptz LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN lease_end >= p_now OR p_call_until IS NULL OR p_call_until < lease_end THEN lease_end
        ELSE p_call_until END
    FROM (SELECT p_locked_at + coalesce(p_lease_us, p_lock_timeout_us) * interval '1 microsecond' AS lease_end) AS l
$$;

-- atomicphase_acquire, as in migration 004, with the lease: the key is held
-- until atomicphase_held_until, an acquisition stores its lease length
-- (p_lock_timeout_us), and a new key that another transaction is recording
-- at this moment (phase fusion: its INSERT is not committed yet) is
-- reported as held at once, rather than waited for.
CREATE OR REPLACE FUNCTION atomicphase_acquire(
    p_scope text, p_key text, p_workflow text, p_fingerprint bytea,
    p_method text, p_path text, p_state bytea, p_lock_timeout_us bigint,
    p_lock_token bigint, p_max_unfinished integer,
    OUT acquired boolean, OUT workflow text, OUT fingerprint bytea,
    OUT recovery_point text, OUT next_phase text, OUT state bytea,
    OUT lock_token bigint, OUT lock_expires_in float8, OUT downstream_salt uuid,
    OUT attempts integer, OUT took_over boolean, OUT over_limit boolean,
    OUT response_status integer, OUT response_header jsonb, OUT response_body bytea
) LANGUAGE plpgsql AS $$
DECLARE
    v_now      timestamptz := now();
    held_since timestamptz;
    v_until    timestamptz;
    v_expires  timestamptz;
BEGIN
    acquired := false;
    took_over := false;
    over_limit := false;
    attempts := 0;
    FOR round IN 1..2 LOOP
        SELECT k.workflow, k.fingerprint, k.recovery_point, k.next_phase, k.lock_token,
               k.locked_at, atomicphase_held_until(k.locked_at, k.lease_us, k.call_until, p_lock_timeout_us),
               atomicphase_lock_expires(k.locked_at, k.lease_us, k.call_until, p_lock_timeout_us, v_now),
               k.attempts, k.response_status, k.response_header, k.response_body
        INTO workflow, fingerprint, recovery_point, next_phase, lock_token,
             held_since, v_until, v_expires, attempts, response_status, response_header, response_body
        FROM idempotency_keys k
        WHERE k.scope = p_scope AND k.idempotency_key = p_key;
        IF FOUND AND (response_status IS NOT NULL OR workflow <> p_workflow
                      OR fingerprint <> p_fingerprint OR v_until >= v_now) THEN
            lock_expires_in := extract(epoch FROM v_expires - v_now)::float8;
            RETURN;
        END IF;
        took_over := FOUND AND held_since IS NOT NULL;
        IF NOT FOUND AND NOT pg_try_advisory_xact_lock(hashtextextended(p_scope || chr(31) || p_key, 7)) THEN
            EXIT; -- being recorded by another transaction: held
        END IF;
        IF NOT FOUND AND p_max_unfinished IS NOT NULL AND p_max_unfinished <= (
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
             state, lock_token, locked_at, lease_us)
        VALUES (p_scope, p_key, p_workflow, p_fingerprint, p_method, p_path,
                p_state, p_lock_token, v_now, p_lock_timeout_us)
        ON CONFLICT (scope, idempotency_key) DO UPDATE
            SET locked_at = v_now, lock_token = p_lock_token, updated_at = v_now,
                attempts = k.attempts + 1, parked_at = NULL, next_attempt_at = NULL,
                lease_us = p_lock_timeout_us
            WHERE k.response_status IS NULL AND k.workflow = p_workflow
              AND k.fingerprint = p_fingerprint
              AND coalesce(atomicphase_held_until(k.locked_at, k.lease_us, k.call_until, p_lock_timeout_us) < v_now, true)
        RETURNING k.workflow, k.fingerprint, k.recovery_point, k.next_phase, k.state,
                  k.lock_token, k.downstream_salt, k.attempts
        INTO workflow, fingerprint, recovery_point, next_phase, state,
             lock_token, downstream_salt, attempts;
        IF FOUND THEN
            acquired := true;
            response_status := NULL;
            response_header := NULL;
            response_body := NULL;
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
$$;

-- atomicphase_record, as in migration 006, with the lease (p_lease_us) and
-- without waiting: it raises SQLSTATE AP002 at once when another
-- transaction is recording the same key at this moment (a duplicate of a
-- new key whose first transaction has not committed), so that the
-- duplicate's transaction, whose remaining statements the error skips,
-- ends at once and gives its connection back, instead of holding it while
-- it waits on the first transaction's uncommitted row. The transaction
-- advisory lock it takes is held until the recording commits or rolls
-- back.
CREATE FUNCTION atomicphase_record(
    p_scope text, p_key text, p_workflow text, p_fingerprint bytea,
    p_method text, p_path text, p_state bytea, p_lock_token bigint,
    p_max_unfinished integer, p_lease_us bigint
) RETURNS TABLE (downstream_salt uuid) LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := now();
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtextextended(p_scope || chr(31) || p_key, 7)) THEN
        RAISE EXCEPTION 'idempotency key % is being recorded by another request', p_key
            USING ERRCODE = 'AP002';
    END IF;
    IF p_max_unfinished IS NOT NULL AND p_max_unfinished <= (
            SELECT count(*) FROM (
                SELECT 1 FROM idempotency_keys u
                WHERE u.scope = p_scope AND u.response_status IS NULL AND u.parked_at IS NULL
                LIMIT p_max_unfinished) AS capped) THEN
        RETURN;
    END IF;
    INSERT INTO idempotency_keys AS k
        (scope, idempotency_key, workflow, fingerprint, request_method, request_path,
         state, lock_token, locked_at, created_at, updated_at, lease_us)
    VALUES (p_scope, p_key, p_workflow, p_fingerprint, p_method, p_path,
            p_state, p_lock_token, v_now, v_now, v_now, p_lease_us)
    ON CONFLICT (scope, idempotency_key) DO NOTHING
    RETURNING k.downstream_salt INTO downstream_salt;
    IF FOUND THEN
        RETURN NEXT;
    END IF;
END
$$;

-- atomicphase_take, as in migration 006, with the lease.
CREATE OR REPLACE FUNCTION atomicphase_take(
    p_scope text, p_key text, p_lock_timeout_us bigint, p_lock_token bigint, p_sweep boolean
) RETURNS TABLE (
    workflow text, recovery_point text, next_phase text, state bytea,
    lock_token bigint, downstream_salt uuid, attempts integer, took_over boolean
) LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := now();
BEGIN
    UPDATE idempotency_keys AS k
    SET locked_at = v_now, lock_token = p_lock_token, updated_at = v_now, parked_at = NULL,
        next_attempt_at = NULL, attempts = k.attempts + 1, lease_us = p_lock_timeout_us
    FROM (SELECT b.locked_at FROM idempotency_keys b
          WHERE b.scope = p_scope AND b.idempotency_key = p_key) AS before
    WHERE k.scope = p_scope AND k.idempotency_key = p_key AND k.response_status IS NULL
      AND coalesce(atomicphase_held_until(k.locked_at, k.lease_us, k.call_until, p_lock_timeout_us) < v_now, true)
      AND (p_sweep IS NOT TRUE
           OR (k.parked_at IS NULL AND (k.next_attempt_at IS NULL OR k.next_attempt_at <= v_now)))
    RETURNING k.workflow, k.recovery_point, k.next_phase, k.state, k.lock_token,
              k.downstream_salt, k.attempts, before.locked_at IS NOT NULL
    INTO workflow, recovery_point, next_phase, state, lock_token,
         downstream_salt, attempts, took_over;
    IF FOUND THEN
        RETURN NEXT;
    END IF;
END
$$;

-- atomicphase_renew renews the lease of the key the caller holds with
-- p_lock_token, for p_lease_us from now, and returns a row (true) when it
-- did; no row when the token moved on, the key was released, or it
-- finished. With p_call_us it also sets call_until to p_call_us from now:
-- the holder is about to make (or is making) a foreign call, and no attempt
-- may take the key before then (p_call_us is the lease plus the grace); or
-- the call has ended, and p_call_us is the grace alone.
CREATE FUNCTION atomicphase_renew(
    p_scope text, p_key text, p_lock_token bigint, p_lease_us bigint, p_call_us bigint
) RETURNS SETOF boolean LANGUAGE plpgsql AS $$
DECLARE
    v_now  timestamptz := now();
    v_call timestamptz := v_now + p_call_us * interval '1 microsecond';
BEGIN
    UPDATE idempotency_keys AS k
    SET locked_at = v_now, lease_us = p_lease_us,
        call_until = CASE WHEN p_call_us IS NULL THEN k.call_until ELSE v_call END
    WHERE k.scope = p_scope AND k.idempotency_key = p_key AND k.lock_token = p_lock_token
      AND k.locked_at IS NOT NULL AND k.response_status IS NULL;
    IF FOUND THEN
        RETURN NEXT true;
    END IF;
END
$$;

-- atomicphase_checkpoint, as in migration 005, also clearing call_until:
-- the call whose result it records has ended.
CREATE OR REPLACE FUNCTION atomicphase_checkpoint(
    p_scope text, p_key text, p_lock_token bigint,
    p_recovery_point text, p_next_phase text, p_state bytea,
    p_status integer, p_header jsonb, p_body bytea
) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
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
        call_until      = NULL,
        updated_at      = v_now
    WHERE scope = p_scope
      AND idempotency_key = p_key
      AND lock_token = p_lock_token
      AND response_status IS NULL;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'idempotency key % lost its lock to a newer attempt', p_key
            USING ERRCODE = 'AP001';
    END IF;
END
$$;

-- atomicphase_record_resolution, as in migration 006, with the lease.
CREATE OR REPLACE FUNCTION atomicphase_record_resolution(
    p_scope text, p_key text, p_happened boolean, p_note text, p_lock_timeout_us bigint
) RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
    v_now      timestamptz := now();
    v_workflow text;
BEGIN
    UPDATE idempotency_keys AS k
    SET resolved_after = k.recovery_point, resolved_happened = p_happened, resolved_note = p_note,
        resolved_at = v_now, parked_at = NULL, next_attempt_at = NULL, updated_at = v_now
    WHERE k.scope = p_scope AND k.idempotency_key = p_key AND k.response_status IS NULL
      AND coalesce(atomicphase_held_until(k.locked_at, k.lease_us, k.call_until, p_lock_timeout_us) < v_now, true)
    RETURNING k.workflow INTO v_workflow;
    IF FOUND THEN
        RETURN NEXT v_workflow;
    END IF;
END
$$;

-- Errors end somewhere. A parked key is an answer, not a loop: a client's
-- retry of it is refused (with the parked key's "failed, waits for an
-- operator") instead of running its phases again; parked keys are bounded
-- (they count toward a scope's cap, and are reaped);  Only
-- functions and indexes are added: the functions a running previous
-- release calls are left as they were.

-- Parked keys are bounded: they count toward a scope's cap on unfinished
-- keys (Config.MaxUnfinishedPerScope), so a client whose requests keep
-- failing permanently runs into the cap instead of minting parked keys
-- without limit, and the sweep reaps them after a retention of their own.
-- (Their indexes are built by migration 010, concurrently.)

-- atomicphase_admit is atomicphase_acquire for a client's request, with
-- three more rules applied first. An unfinished key that is parked (and
-- unlocked), recorded for the same workflow and request, and parked for
-- good (a permanent failure, a bug: final_parked_at is its parked_at) is
-- not taken: parked is true and nothing is written (a park that lands
-- after this read is seen by atomicphase_acquire's take, which refuses such
-- a key under its row lock). A key parked because its attempts ran out is taken, as the sweep
-- is not: parking stops the sweep, not the client, whose retry may find the
-- downstream back (a parked key used with another request is left to
-- atomicphase_acquire, which reports the mismatch). A new key's scope counts its parked keys
-- toward p_max_unfinished, besides the unfinished keys atomicphase_acquire
-- counts, and the count and the insert are serialised per scope by a
-- transaction-scoped advisory lock on the scope, so that concurrent new
-- keys cannot all count the same keys and pass the cap together.
-- Everything else is atomicphase_acquire's, in the same statement and
-- round trip.
CREATE FUNCTION atomicphase_admit(
    p_scope text, p_key text, p_workflow text, p_fingerprint bytea,
    p_method text, p_path text, p_state bytea, p_lock_timeout_us bigint,
    p_lock_token bigint, p_max_unfinished integer,
    OUT acquired boolean, OUT workflow text, OUT fingerprint bytea,
    OUT recovery_point text, OUT next_phase text, OUT state bytea,
    OUT lock_token bigint, OUT lock_expires_in float8, OUT downstream_salt uuid,
    OUT attempts integer, OUT took_over boolean, OUT over_limit boolean,
    OUT response_status integer, OUT response_header jsonb, OUT response_body bytea,
    OUT parked boolean
) LANGUAGE plpgsql AS $$
DECLARE
    v_max integer := p_max_unfinished;
BEGIN
    SELECT k.parked_at IS NOT NULL AND k.locked_at IS NULL AND k.response_status IS NULL
               AND k.workflow = p_workflow AND k.fingerprint = p_fingerprint
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
        PERFORM pg_advisory_xact_lock(hashtextextended('atomicphase.scope_cap:' || p_scope, 0));
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
$$;

-- Why a key was parked. final_parked_at is set, to the same time as
-- parked_at, when the key was parked for good: a permanent failure, which
-- no retry can get past until an operator acts. A key parked again later
-- (its attempts ran out), or unparked, has a parked_at of another time, or
-- none: the mark is stale by construction, and no other function needs to
-- clear it.
ALTER TABLE idempotency_keys ADD COLUMN final_parked_at timestamptz;

-- atomicphase_release with p_final: the release migration 006 defined,
-- which, when it parks the key for good, marks it so (final_parked_at).
-- The seven-argument function a previous release calls is left as it is.
CREATE FUNCTION atomicphase_release(
    p_scope text, p_key text, p_lock_token bigint,
    p_error text, p_retry_in_us bigint, p_park boolean, p_unknown boolean, p_final boolean
) RETURNS SETOF boolean LANGUAGE plpgsql AS $$
DECLARE
    v_now  timestamptz := now();
    v_next timestamptz := v_now + p_retry_in_us * interval '1 microsecond';
BEGIN
    UPDATE idempotency_keys AS k SET
        locked_at = NULL,
        updated_at = v_now,
        last_error = coalesce(p_error, k.last_error),
        next_attempt_at = CASE WHEN p_retry_in_us IS NULL THEN k.next_attempt_at ELSE v_next END,
        parked_at = CASE WHEN p_park THEN v_now ELSE k.parked_at END,
        final_parked_at = CASE WHEN p_park AND p_final THEN v_now ELSE k.final_parked_at END,
        unknown_at = CASE WHEN p_unknown THEN coalesce(k.unknown_at, v_now) ELSE k.unknown_at END
    WHERE k.scope = p_scope AND k.idempotency_key = p_key AND k.lock_token = p_lock_token
      AND k.response_status IS NULL;
    IF FOUND THEN
        RETURN NEXT true;
    END IF;
END
$$;

-- atomicphase_acquire as migration 007 has it, whose take also refuses a
-- key parked for good, checked under the row's lock: a retry that read the
-- key before it was parked (atomicphase_admit's check) then finds it held,
-- never runs it again. A previous release never parks a key for good, so
-- what it gets is unchanged.
CREATE OR REPLACE FUNCTION atomicphase_acquire(
    p_scope text, p_key text, p_workflow text, p_fingerprint bytea,
    p_method text, p_path text, p_state bytea, p_lock_timeout_us bigint,
    p_lock_token bigint, p_max_unfinished integer,
    OUT acquired boolean, OUT workflow text, OUT fingerprint bytea,
    OUT recovery_point text, OUT next_phase text, OUT state bytea,
    OUT lock_token bigint, OUT lock_expires_in float8, OUT downstream_salt uuid,
    OUT attempts integer, OUT took_over boolean, OUT over_limit boolean,
    OUT response_status integer, OUT response_header jsonb, OUT response_body bytea
) LANGUAGE plpgsql AS $$
DECLARE
    v_now      timestamptz := now();
    held_since timestamptz;
    v_until    timestamptz;
    v_expires  timestamptz;
BEGIN
    acquired := false;
    took_over := false;
    over_limit := false;
    attempts := 0;
    FOR round IN 1..2 LOOP
        SELECT k.workflow, k.fingerprint, k.recovery_point, k.next_phase, k.lock_token,
               k.locked_at, atomicphase_held_until(k.locked_at, k.lease_us, k.call_until, p_lock_timeout_us),
               atomicphase_lock_expires(k.locked_at, k.lease_us, k.call_until, p_lock_timeout_us, v_now),
               k.attempts, k.response_status, k.response_header, k.response_body
        INTO workflow, fingerprint, recovery_point, next_phase, lock_token,
             held_since, v_until, v_expires, attempts, response_status, response_header, response_body
        FROM idempotency_keys k
        WHERE k.scope = p_scope AND k.idempotency_key = p_key;
        IF FOUND AND (response_status IS NOT NULL OR workflow <> p_workflow
                      OR fingerprint <> p_fingerprint OR v_until >= v_now) THEN
            lock_expires_in := extract(epoch FROM v_expires - v_now)::float8;
            RETURN;
        END IF;
        took_over := FOUND AND held_since IS NOT NULL;
        IF NOT FOUND AND NOT pg_try_advisory_xact_lock(hashtextextended(p_scope || chr(31) || p_key, 7)) THEN
            EXIT; -- being recorded by another transaction: held
        END IF;
        IF NOT FOUND AND p_max_unfinished IS NOT NULL AND p_max_unfinished <= (
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
             state, lock_token, locked_at, lease_us)
        VALUES (p_scope, p_key, p_workflow, p_fingerprint, p_method, p_path,
                p_state, p_lock_token, v_now, p_lock_timeout_us)
        ON CONFLICT (scope, idempotency_key) DO UPDATE
            SET locked_at = v_now, lock_token = p_lock_token, updated_at = v_now,
                attempts = k.attempts + 1, parked_at = NULL, next_attempt_at = NULL,
                lease_us = p_lock_timeout_us
            WHERE k.response_status IS NULL AND k.workflow = p_workflow
              AND (k.final_parked_at IS NULL OR k.final_parked_at IS DISTINCT FROM k.parked_at)
              AND k.fingerprint = p_fingerprint
              AND coalesce(atomicphase_held_until(k.locked_at, k.lease_us, k.call_until, p_lock_timeout_us) < v_now, true)
        RETURNING k.workflow, k.fingerprint, k.recovery_point, k.next_phase, k.state,
                  k.lock_token, k.downstream_salt, k.attempts
        INTO workflow, fingerprint, recovery_point, next_phase, state,
             lock_token, downstream_salt, attempts;
        IF FOUND THEN
            acquired := true;
            response_status := NULL;
            response_header := NULL;
            response_body := NULL;
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
$$;


-- The console (migration 009): a verdict's result, the function that records
-- it, and the operators' audit trail. It builds no index on the key table
-- (the console's pages use the indexes there are), so it runs in a
-- transaction like the migrations before it.

-- An operator's "happened" verdict may carry the call's result (the label id
-- the downstream's support read out, say): JSON the phase's reconcile
-- function reads from ForeignCall.OperatorResult and records in the state,
-- as the call function would have. NULL when the verdict came without one.
ALTER TABLE idempotency_keys ADD COLUMN resolved_result jsonb;

-- atomicphase_record_verdict records an operator's verdict, and the call's
-- result (or NULL), on the foreign call an unfinished key waits on, for the
-- phase after its current recovery point; makes the key due at once; and,
-- as atomicphase_unpark does, gives it a fresh budget of attempts: a key
-- parked because its reconciliation failed Config.MaxAttempts times would
-- otherwise be parked again by the sweep before the verdict is read. It
-- returns one row for an unfinished key nobody holds: its workflow, and
-- whether the verdict was recorded, which it is only when the key waits on
-- an unknown outcome (unknown_at set); no row when the key is finished,
-- absent, or held by a live attempt.
CREATE FUNCTION atomicphase_record_verdict(
    p_scope text, p_key text, p_happened boolean, p_note text, p_lock_timeout_us bigint, p_result jsonb
) RETURNS TABLE (workflow text, recorded boolean) LANGUAGE plpgsql AS $$
DECLARE
    v_now        timestamptz := now();
BEGIN
    UPDATE idempotency_keys AS k
    SET resolved_after = k.recovery_point, resolved_happened = p_happened, resolved_note = p_note,
        resolved_result = p_result, resolved_at = v_now, parked_at = NULL, next_attempt_at = NULL,
        updated_at = v_now, attempts = 1
    WHERE k.scope = p_scope AND k.idempotency_key = p_key AND k.response_status IS NULL
      AND k.unknown_at IS NOT NULL
      AND coalesce(atomicphase_held_until(k.locked_at, k.lease_us, k.call_until, p_lock_timeout_us) < v_now, true)
    RETURNING k.workflow INTO workflow;
    IF FOUND THEN
        recorded := true;
        RETURN NEXT;
        RETURN;
    END IF;
    SELECT k.workflow, false INTO workflow, recorded
    FROM idempotency_keys k
    WHERE k.scope = p_scope AND k.idempotency_key = p_key AND k.response_status IS NULL
      AND coalesce(atomicphase_held_until(k.locked_at, k.lease_us, k.call_until, p_lock_timeout_us) < v_now, true);
    IF FOUND THEN
        RETURN NEXT;
    END IF;
END
$$;

-- The verdict of an older library (which knows no result) clears any result
-- an earlier verdict left, so that it is never taken for this one's; it is
-- otherwise migration 007's function.
CREATE OR REPLACE FUNCTION atomicphase_record_resolution(
    p_scope text, p_key text, p_happened boolean, p_note text, p_lock_timeout_us bigint
) RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
    v_now        timestamptz := now();
    v_workflow   text;
BEGIN
    UPDATE idempotency_keys AS k
    SET resolved_after = k.recovery_point, resolved_happened = p_happened, resolved_note = p_note,
        resolved_result = NULL, resolved_at = v_now, parked_at = NULL, next_attempt_at = NULL, updated_at = v_now
    WHERE k.scope = p_scope AND k.idempotency_key = p_key AND k.response_status IS NULL
      AND coalesce(atomicphase_held_until(k.locked_at, k.lease_us, k.call_until, p_lock_timeout_us) < v_now, true)
    RETURNING k.workflow INTO v_workflow;
    IF FOUND THEN
        RETURN NEXT v_workflow;
    END IF;
END
$$;

-- The operators' audit trail: every action an operator takes on a key from
-- the console, its API or the CLI (resume, unpark, forget, resolve), with
-- who (as the embedding service or the CLI's environment names them), when,
-- the key and the note. A table of its own: it outlives the key's row, which
-- forget and the reap delete. Read by (scope, key), newest first.
CREATE TABLE atomicphase_audit (
    scope           text        NOT NULL,
    idempotency_key text        NOT NULL,
    id              bigint      GENERATED ALWAYS AS IDENTITY,
    at              timestamptz NOT NULL DEFAULT now(),
    actor           text        NOT NULL,
    action          text        NOT NULL,
    note            text        NOT NULL DEFAULT '',
    -- What the action carried: a verdict and the call's result, a bulk
    -- action's filter.
    detail          jsonb,
    -- A key's trail is read by (scope, key), newest first: the primary
    -- key's index, built with the new, empty table.
    PRIMARY KEY (scope, idempotency_key, id)
);

-- atomicphase:no-transaction
-- The indexes of parked keys (migration 008): a scope's parked keys count
-- toward its cap on unfinished keys, and the sweep reaps parked keys past
-- their retention. Built concurrently, outside a transaction, so that no
-- write to the key table waits for the build; Migrate drops a build an
-- interrupted run left invalid and builds it again.
CREATE INDEX CONCURRENTLY IF NOT EXISTS idempotency_keys_parked_scope_idx ON idempotency_keys (scope)
    WHERE response_status IS NULL AND parked_at IS NOT NULL;
CREATE INDEX CONCURRENTLY IF NOT EXISTS idempotency_keys_parked_at_idx ON idempotency_keys (parked_at)
    WHERE response_status IS NULL AND parked_at IS NOT NULL;

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
ALTER TABLE idempotency_keys ADD COLUMN workflow_version text;
ALTER TABLE idempotency_keys
    ALTER COLUMN workflow_version SET DEFAULT nullif(current_setting('atomicphase.workflow_version', true), '');

-- The versions processes run: each Runner records the (workflow, version)
-- pairs it registered, with their phases, and refreshes seen_at as its
-- sweep runs. A version not seen within a horizon is not deployed.
-- shape is the version derived from the phase list, whether or not the
-- version was declared: two processes that declare one version with
-- different phase lists are refused.
CREATE TABLE atomicphase_workflow_versions (
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
CREATE FUNCTION atomicphase_admit(
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
$$;

-- atomicphase_record with the workflow version the new key records.
CREATE FUNCTION atomicphase_record(
    p_scope text, p_key text, p_workflow text, p_fingerprint bytea,
    p_method text, p_path text, p_state bytea, p_lock_token bigint,
    p_max_unfinished integer, p_lease_us bigint, p_version text
) RETURNS TABLE (downstream_salt uuid) LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('atomicphase.workflow_version', coalesce(p_version, ''), true);
    RETURN QUERY SELECT r.downstream_salt FROM atomicphase_record(
        p_scope, p_key, p_workflow, p_fingerprint, p_method, p_path, p_state,
        p_lock_token, p_max_unfinished, p_lease_us) AS r;
    PERFORM set_config('atomicphase.workflow_version', '', true);
END
$$;

-- The key row written once per commit (migration 012). A new key recorded
-- with its workflow's first transaction was inserted at the head of that
-- transaction (atomicphase_record) and updated by the checkpoint at its end:
-- two writes of one row, in one transaction. Now the head only claims the
-- key (atomicphase_claim: the advisory lock that makes a duplicate of a new
-- key answer 409 at once), and the commit inserts the row as the checkpoint
-- would have left it (atomicphase_record_unit). And atomicphase_lock_expires,
-- which every replay's read calls, is rewritten to be inlined (the same
-- result). Expand only: new functions; atomicphase_record, which a previous
-- release calls, is unchanged.

-- atomicphase_claim takes the transaction-scoped advisory lock a new key's
-- recording holds until its transaction ends (the lock atomicphase_record
-- and atomicphase_acquire take), or raises AP002 at once when another
-- transaction holds it (a duplicate of a new key in flight), or AP003 when
-- the key was recorded since the caller looked: either way the caller's
-- unit runs nothing, and the request goes on as an existing key's.
CREATE FUNCTION atomicphase_claim(p_scope text, p_key text)
RETURNS void LANGUAGE plpgsql AS $$
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
$$;

-- atomicphase_record_unit records a new key, locked under the caller's
-- lock token, at the commit of its first transaction, with that
-- transaction's recovery point, jump target, state and (when the workflow
-- responded) response: the row atomicphase_record and
-- atomicphase_checkpoint would have left, in one INSERT. When the key
-- exists (recorded meanwhile, by a request that did not wait for the
-- claim) it raises AP003, and the transaction, whose COMMIT is queued
-- behind it, rolls back.
CREATE FUNCTION atomicphase_record_unit(
    p_scope text, p_key text, p_workflow text, p_fingerprint bytea,
    p_method text, p_path text, p_lock_token bigint, p_lease_us bigint, p_version text,
    p_recovery_point text, p_next_phase text, p_state bytea,
    p_status integer, p_header jsonb, p_body bytea
) RETURNS TABLE (downstream_salt uuid) LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
    INSERT INTO idempotency_keys AS k
        (scope, idempotency_key, workflow, fingerprint, request_method, request_path,
         state, lock_token, locked_at, created_at, updated_at, lease_us, workflow_version,
         recovery_point, next_phase, response_status, response_header, response_body, finished_at)
    VALUES (p_scope, p_key, p_workflow, p_fingerprint, p_method, p_path,
            p_state, p_lock_token, CASE WHEN p_status IS NULL THEN v_now END, v_now, v_now, p_lease_us, p_version,
            p_recovery_point, p_next_phase, p_status, p_header, p_body,
            CASE WHEN p_status IS NOT NULL THEN v_now END)
    ON CONFLICT (scope, idempotency_key) DO NOTHING
    RETURNING k.downstream_salt INTO downstream_salt;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'idempotency key % was recorded by another request meanwhile', p_key
            USING ERRCODE = 'AP003';
    END IF;
    RETURN NEXT;
END
$$;

-- atomicphase_lock_expires, as in migration 007, written as one expression:
-- a SQL function whose body has a FROM clause is not inlined, and every
-- replay's read of its key paid for a function call. The same result.
CREATE OR REPLACE FUNCTION atomicphase_lock_expires(
    p_locked_at timestamptz, p_lease_us bigint, p_call_until timestamptz, p_lock_timeout_us bigint,
    p_now timestamptz
) RETURNS timestamptz LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN p_locked_at + coalesce(p_lease_us, p_lock_timeout_us) * interval '1 microsecond' >= p_now
          OR p_call_until IS NULL
          OR p_call_until < p_locked_at + coalesce(p_lease_us, p_lock_timeout_us) * interval '1 microsecond'
        THEN p_locked_at + coalesce(p_lease_us, p_lock_timeout_us) * interval '1 microsecond'
        ELSE p_call_until END
$$;

-- atomicphase_acquire, as in migration 008, with the held-until rule
-- written out in its upsert's ON CONFLICT ... WHERE with immutable
-- operators only (timestamptz minus timestamptz, interval arithmetic,
-- comparisons) instead of calling atomicphase_held_until, whose
-- timestamptz + interval is only stable: Citus refuses an INSERT on a
-- distributed table whose ON CONFLICT clause calls anything not IMMUTABLE,
-- and every acquisition of an existing key failed there. The same rule: a
-- key is takeable when its lease ended (or it is unlocked) and no foreign
-- call's quiet period is still to come.
CREATE OR REPLACE FUNCTION atomicphase_acquire(
    p_scope text, p_key text, p_workflow text, p_fingerprint bytea,
    p_method text, p_path text, p_state bytea, p_lock_timeout_us bigint,
    p_lock_token bigint, p_max_unfinished integer,
    OUT acquired boolean, OUT workflow text, OUT fingerprint bytea,
    OUT recovery_point text, OUT next_phase text, OUT state bytea,
    OUT lock_token bigint, OUT lock_expires_in float8, OUT downstream_salt uuid,
    OUT attempts integer, OUT took_over boolean, OUT over_limit boolean,
    OUT response_status integer, OUT response_header jsonb, OUT response_body bytea
) LANGUAGE plpgsql AS $$
DECLARE
    v_now      timestamptz := now();
    held_since timestamptz;
    v_until    timestamptz;
    v_expires  timestamptz;
BEGIN
    acquired := false;
    took_over := false;
    over_limit := false;
    attempts := 0;
    FOR round IN 1..2 LOOP
        SELECT k.workflow, k.fingerprint, k.recovery_point, k.next_phase, k.lock_token,
               k.locked_at, atomicphase_held_until(k.locked_at, k.lease_us, k.call_until, p_lock_timeout_us),
               atomicphase_lock_expires(k.locked_at, k.lease_us, k.call_until, p_lock_timeout_us, v_now),
               k.attempts, k.response_status, k.response_header, k.response_body
        INTO workflow, fingerprint, recovery_point, next_phase, lock_token,
             held_since, v_until, v_expires, attempts, response_status, response_header, response_body
        FROM idempotency_keys k
        WHERE k.scope = p_scope AND k.idempotency_key = p_key;
        IF FOUND AND (response_status IS NOT NULL OR workflow <> p_workflow
                      OR fingerprint <> p_fingerprint OR v_until >= v_now) THEN
            lock_expires_in := extract(epoch FROM v_expires - v_now)::float8;
            RETURN;
        END IF;
        took_over := FOUND AND held_since IS NOT NULL;
        IF NOT FOUND AND NOT pg_try_advisory_xact_lock(hashtextextended(p_scope || chr(31) || p_key, 7)) THEN
            EXIT; -- being recorded by another transaction: held
        END IF;
        IF NOT FOUND AND p_max_unfinished IS NOT NULL AND p_max_unfinished <= (
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
             state, lock_token, locked_at, lease_us)
        VALUES (p_scope, p_key, p_workflow, p_fingerprint, p_method, p_path,
                p_state, p_lock_token, v_now, p_lock_timeout_us)
        ON CONFLICT (scope, idempotency_key) DO UPDATE
            SET locked_at = v_now, lock_token = p_lock_token, updated_at = v_now,
                attempts = k.attempts + 1, parked_at = NULL, next_attempt_at = NULL,
                lease_us = p_lock_timeout_us
            WHERE k.response_status IS NULL AND k.workflow = p_workflow
              AND (k.final_parked_at IS NULL OR k.final_parked_at IS DISTINCT FROM k.parked_at)
              AND k.fingerprint = p_fingerprint
              AND (k.locked_at IS NULL OR v_now - k.locked_at > coalesce(k.lease_us, p_lock_timeout_us) * interval '1 microsecond')
              AND (k.call_until IS NULL OR k.call_until < v_now)
        RETURNING k.workflow, k.fingerprint, k.recovery_point, k.next_phase, k.state,
                  k.lock_token, k.downstream_salt, k.attempts
        INTO workflow, fingerprint, recovery_point, next_phase, state,
             lock_token, downstream_salt, attempts;
        IF FOUND THEN
            acquired := true;
            response_status := NULL;
            response_header := NULL;
            response_body := NULL;
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
$$;

-- atomicphase_take (migration 007), atomicphase_record_verdict and
-- atomicphase_record_resolution (migration 009), with the held-until rule
-- in their UPDATE written with immutable operators only, as migration 013
-- did for atomicphase_acquire: Citus refuses an UPDATE of a distributed
-- table whose CASE or COALESCE calls anything not IMMUTABLE, and
-- atomicphase_held_until's timestamptz + interval is only stable, so on
-- Citus every take (the sweep's, Resume's) and every operator verdict
-- failed. The same rule: a key may be taken when its lease ended (or it is
-- unlocked) and no foreign call's quiet period is still to come.

CREATE OR REPLACE FUNCTION atomicphase_take(
    p_scope text, p_key text, p_lock_timeout_us bigint, p_lock_token bigint, p_sweep boolean
) RETURNS TABLE (
    workflow text, recovery_point text, next_phase text, state bytea,
    lock_token bigint, downstream_salt uuid, attempts integer, took_over boolean
) LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := now();
BEGIN
    UPDATE idempotency_keys AS k
    SET locked_at = v_now, lock_token = p_lock_token, updated_at = v_now, parked_at = NULL,
        next_attempt_at = NULL, attempts = k.attempts + 1, lease_us = p_lock_timeout_us
    FROM (SELECT b.locked_at FROM idempotency_keys b
          WHERE b.scope = p_scope AND b.idempotency_key = p_key) AS before
    WHERE k.scope = p_scope AND k.idempotency_key = p_key AND k.response_status IS NULL
      AND (k.locked_at IS NULL OR v_now - k.locked_at > coalesce(k.lease_us, p_lock_timeout_us) * interval '1 microsecond')
      AND (k.call_until IS NULL OR k.call_until < v_now)
      AND (p_sweep IS NOT TRUE
           OR (k.parked_at IS NULL AND (k.next_attempt_at IS NULL OR k.next_attempt_at <= v_now)))
    RETURNING k.workflow, k.recovery_point, k.next_phase, k.state, k.lock_token,
              k.downstream_salt, k.attempts, before.locked_at IS NOT NULL
    INTO workflow, recovery_point, next_phase, state, lock_token,
         downstream_salt, attempts, took_over;
    IF FOUND THEN
        RETURN NEXT;
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION atomicphase_record_verdict(
    p_scope text, p_key text, p_happened boolean, p_note text, p_lock_timeout_us bigint, p_result jsonb
) RETURNS TABLE (workflow text, recorded boolean) LANGUAGE plpgsql AS $$
DECLARE
    v_now        timestamptz := now();
BEGIN
    UPDATE idempotency_keys AS k
    SET resolved_after = k.recovery_point, resolved_happened = p_happened, resolved_note = p_note,
        resolved_result = p_result, resolved_at = v_now, parked_at = NULL, next_attempt_at = NULL,
        updated_at = v_now, attempts = 1
    WHERE k.scope = p_scope AND k.idempotency_key = p_key AND k.response_status IS NULL
      AND k.unknown_at IS NOT NULL
      AND (k.locked_at IS NULL OR v_now - k.locked_at > coalesce(k.lease_us, p_lock_timeout_us) * interval '1 microsecond')
      AND (k.call_until IS NULL OR k.call_until < v_now)
    RETURNING k.workflow INTO workflow;
    IF FOUND THEN
        recorded := true;
        RETURN NEXT;
        RETURN;
    END IF;
    SELECT k.workflow, false INTO workflow, recorded
    FROM idempotency_keys k
    WHERE k.scope = p_scope AND k.idempotency_key = p_key AND k.response_status IS NULL
      AND coalesce(atomicphase_held_until(k.locked_at, k.lease_us, k.call_until, p_lock_timeout_us) < v_now, true);
    IF FOUND THEN
        RETURN NEXT;
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION atomicphase_record_resolution(
    p_scope text, p_key text, p_happened boolean, p_note text, p_lock_timeout_us bigint
) RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
    v_now        timestamptz := now();
    v_workflow   text;
BEGIN
    UPDATE idempotency_keys AS k
    SET resolved_after = k.recovery_point, resolved_happened = p_happened, resolved_note = p_note,
        resolved_result = NULL, resolved_at = v_now, parked_at = NULL, next_attempt_at = NULL, updated_at = v_now
    WHERE k.scope = p_scope AND k.idempotency_key = p_key AND k.response_status IS NULL
      AND (k.locked_at IS NULL OR v_now - k.locked_at > coalesce(k.lease_us, p_lock_timeout_us) * interval '1 microsecond')
      AND (k.call_until IS NULL OR k.call_until < v_now)
    RETURNING k.workflow INTO v_workflow;
    IF FOUND THEN
        RETURN NEXT v_workflow;
    END IF;
END
$$;

-- called_at: when a foreign call of the key may first have gone out, as
-- the attempt that released the key knew it (a call sent, a foreign phase
-- committed, or an earlier attempt's call resumed into), kept until the
-- key is finished. A parked key with it set may have paid: forgetting or
-- reaping it would let the client's retry run as a new request, with new
-- downstream keys, and pay again. Written only when an attempt fails,
-- never on a request that succeeds.
ALTER TABLE idempotency_keys ADD COLUMN called_at timestamptz;

-- atomicphase_release with p_called: migration 008's release, which also
-- records that a foreign call of the key may have gone out. The eight- and
-- seven-argument functions a previous release calls follow.
CREATE FUNCTION atomicphase_release(
    p_scope text, p_key text, p_lock_token bigint,
    p_error text, p_retry_in_us bigint, p_park boolean, p_unknown boolean, p_final boolean,
    p_called boolean
) RETURNS SETOF boolean LANGUAGE plpgsql AS $$
DECLARE
    v_now  timestamptz := now();
    v_next timestamptz := v_now + p_retry_in_us * interval '1 microsecond';
BEGIN
    UPDATE idempotency_keys AS k SET
        locked_at = NULL,
        updated_at = v_now,
        last_error = coalesce(p_error, k.last_error),
        next_attempt_at = CASE WHEN p_retry_in_us IS NULL THEN k.next_attempt_at ELSE v_next END,
        parked_at = CASE WHEN p_park THEN v_now ELSE k.parked_at END,
        final_parked_at = CASE WHEN p_park AND p_final THEN v_now ELSE k.final_parked_at END,
        unknown_at = CASE WHEN p_unknown THEN coalesce(k.unknown_at, v_now) ELSE k.unknown_at END,
        called_at = CASE WHEN p_called THEN coalesce(k.called_at, v_now) ELSE k.called_at END
    WHERE k.scope = p_scope AND k.idempotency_key = p_key AND k.lock_token = p_lock_token
      AND k.response_status IS NULL;
    IF FOUND THEN
        RETURN NEXT true;
    END IF;
END
$$;

-- The releases a previous release calls (seven and eight arguments), as
-- migrations 006 and 008 define them, but parking a key records that a
-- call may have gone out: a process of the previous release does not know
-- whether one did, and a key it parks must not be given up as if none had.
CREATE OR REPLACE FUNCTION atomicphase_release(
    p_scope text, p_key text, p_lock_token bigint,
    p_error text, p_retry_in_us bigint, p_park boolean, p_unknown boolean
) RETURNS SETOF boolean LANGUAGE plpgsql AS $$
DECLARE
    v_now  timestamptz := now();
    v_next timestamptz := v_now + p_retry_in_us * interval '1 microsecond';
BEGIN
    UPDATE idempotency_keys AS k SET
        locked_at = NULL,
        updated_at = v_now,
        last_error = coalesce(p_error, k.last_error),
        next_attempt_at = CASE WHEN p_retry_in_us IS NULL THEN k.next_attempt_at ELSE v_next END,
        parked_at = CASE WHEN p_park THEN v_now ELSE k.parked_at END,
        unknown_at = CASE WHEN p_unknown THEN coalesce(k.unknown_at, v_now) ELSE k.unknown_at END,
        called_at = CASE WHEN p_park THEN coalesce(k.called_at, v_now) ELSE k.called_at END
    WHERE k.scope = p_scope AND k.idempotency_key = p_key AND k.lock_token = p_lock_token
      AND k.response_status IS NULL;
    IF FOUND THEN
        RETURN NEXT true;
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION atomicphase_release(
    p_scope text, p_key text, p_lock_token bigint,
    p_error text, p_retry_in_us bigint, p_park boolean, p_unknown boolean, p_final boolean
) RETURNS SETOF boolean LANGUAGE plpgsql AS $$
DECLARE
    v_now  timestamptz := now();
    v_next timestamptz := v_now + p_retry_in_us * interval '1 microsecond';
BEGIN
    UPDATE idempotency_keys AS k SET
        locked_at = NULL,
        updated_at = v_now,
        last_error = coalesce(p_error, k.last_error),
        next_attempt_at = CASE WHEN p_retry_in_us IS NULL THEN k.next_attempt_at ELSE v_next END,
        parked_at = CASE WHEN p_park THEN v_now ELSE k.parked_at END,
        final_parked_at = CASE WHEN p_park AND p_final THEN v_now ELSE k.final_parked_at END,
        unknown_at = CASE WHEN p_unknown THEN coalesce(k.unknown_at, v_now) ELSE k.unknown_at END,
        called_at = CASE WHEN p_park THEN coalesce(k.called_at, v_now) ELSE k.called_at END
    WHERE k.scope = p_scope AND k.idempotency_key = p_key AND k.lock_token = p_lock_token
      AND k.response_status IS NULL;
    IF FOUND THEN
        RETURN NEXT true;
    END IF;
END
$$;

-- Keys parked before this migration may have paid: nothing recorded
-- whether a call of theirs went out, so each counts as if one had.
-- (Parked keys are few, and found through the parked indexes.)
UPDATE idempotency_keys SET called_at = parked_at
WHERE response_status IS NULL AND parked_at IS NOT NULL AND called_at IS NULL;

-- The sweep finds abandoned keys without an index on the request's path
-- (migration 017 drops the indexes every request paid for). A key that
-- went wrong carries next_attempt_at, and the index of such keys
-- (idempotency_keys_waiting_idx, 017) is all the sweep reads to pick keys:
-- a failed attempt sets it to when to try again (as before), and now every
-- take of an existing key, unpark and verdict sets it too (to the present:
-- due at once, once no live attempt holds the key), where they cleared it.
-- The finish clears it, so a request that succeeds first time never
-- writes it, and its finish changes no indexed column (a HOT update).
--
-- What is left is the key that never failed and whose process died: the
-- sweep finds it in creation order, behind a watermark. Every key created
-- before atomicphase_sweep_watermark.created_before that is unfinished and
-- unparked carries next_attempt_at; the sweep moves the watermark up,
-- marking each unfinished key it passes (next_attempt_at := created_at:
-- due, once its lease is over). A key's row is stamped before its
-- transaction commits, and may show up later: the watermark moves in two
-- steps. A sweep plans how far the next may go (pending_before: the
-- present) with the transactions then in progress (pending_xmax: every
-- transaction that could still write a key created before it has an id
-- below that); a later sweep moves up to the plan once they have all
-- ended (though no nearer the present than one lock timeout), reading the
-- keys it passes then.
CREATE TABLE atomicphase_sweep_watermark (
    name           text        PRIMARY KEY,
    created_before timestamptz NOT NULL,
    pending_before timestamptz,
    pending_xmax   xid8,
    -- On Citus, the workers' pg_snapshot_xmax at the plan, by node.
    pending_nodes  jsonb
);

-- Every unfinished key now marked, so the watermark may start here (with a
-- margin for transactions committing as this one runs).
UPDATE idempotency_keys SET next_attempt_at = created_at
WHERE response_status IS NULL AND parked_at IS NULL AND next_attempt_at IS NULL;
INSERT INTO atomicphase_sweep_watermark (name, created_before)
VALUES ('abandoned', now() - interval '5 minutes');


-- Each key's state, stored (status), the one truth every reader and every
-- writer goes by, and a key's history. Expand only: a column, a table and
-- the functions rewritten under their names, so that the previous
-- release, which writes keys only through them, keeps every key's status
-- true while this one rolls out.
--
-- status is one of:
--   r  running: an attempt holds the key (its lease, locked_at and
--      lease_us, running or run out: a reader calls it stale);
--   w  waiting: nobody holds it; a retry or the sweep resumes it;
--   u  unknown: nobody holds it, and a foreign call's outcome is unknown;
--   p  parked: a permanent failure, or its attempts spent;
--   f  finished: its response is stored, and final.
-- Time changes none: a running key whose lease ran out and a waiting key
-- in a foreign call's quiet period are what a reader makes of the status
-- and the lease, never a write. Every statement that moves a key sets it,
-- and names in its WHERE the states key_state.go's table lets that
-- operation move a key from (TestKeyStateTableIsTheDatabases). The other
-- columns of a state are its data: locked_at and lease_us a running key's
-- lease, parked_at (and final_parked_at) a parked key's, unknown_at an
-- unknown outcome's, response_* a finished key's answer.
--
-- Every existing key is finished but for the few that are not: the column
-- is added with 'f' for all at once (PostgreSQL stores the default, it
-- writes no row), then those are set to what their columns say, and the
-- default goes, so that a writer that does not say a key's state fails.
-- On Citus, the key table may be distributed already: its multi-shard
-- commands run in order (as Migrate has them run), for the functions after
-- them to be created (a setting of no effect elsewhere).
SET LOCAL citus.multi_shard_modify_mode TO 'sequential';
ALTER TABLE idempotency_keys ADD COLUMN status "char" NOT NULL DEFAULT 'f';
UPDATE idempotency_keys
SET status = CASE WHEN parked_at IS NOT NULL THEN 'p'
                  WHEN locked_at IS NOT NULL THEN 'r'
                  WHEN unknown_at IS NOT NULL THEN 'u'
                  ELSE 'w' END
WHERE response_status IS NULL;
ALTER TABLE idempotency_keys ALTER COLUMN status DROP DEFAULT;

-- A key's history: what went wrong with it, one row per event, written by
-- the functions below only when something does (an attempt that failed,
-- or left an outcome unknown, or parked the key; a take of a key that went
-- wrong, or of one whose holder's lease ran out; an unpark, a verdict; the
-- finish of a key that went wrong). A request that succeeds first time
-- writes none. Operators' actions, with who took them, are in
-- atomicphase_audit. Deleted with its key.
CREATE TABLE atomicphase_key_history (
    scope           text        NOT NULL,
    idempotency_key text        NOT NULL,
    id              bigint      GENERATED ALWAYS AS IDENTITY,
    at              timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- failed, unknown, parked, resumed, taken_over, unparked, resolved,
    -- settled, finished
    event           text        NOT NULL,
    status_before   text        NOT NULL,
    status          text        NOT NULL,
    recovery_point  text        NOT NULL,
    -- The key's attempts, and the lock token of the attempt the event is
    -- of (the one that failed, the one that took the key).
    attempt         integer     NOT NULL,
    lock_token      bigint      NOT NULL,
    -- Why the attempt failed (the key's last_error), for a failure.
    error           text,
    PRIMARY KEY (scope, idempotency_key, id)
);

-- On Citus, a key table already distributed takes its history beside it,
-- on the same shards. (A new install's is distributed with the key table,
-- CitusDistribution.) Every operator named with its schema, every
-- comparison between values of one type: nothing a role planted on the
-- path stands in for them (docs/security-and-limits.md, "Database roles").
DO $$
DECLARE
    v_keys    regclass := (SELECT t.typrelid FROM pg_catalog.pg_type t
                           WHERE t.oid OPERATOR(pg_catalog.=) pg_catalog.pg_typeof(NULL::idempotency_keys)::pg_catalog.oid);
    v_history regclass := (SELECT t.typrelid FROM pg_catalog.pg_type t
                           WHERE t.oid OPERATOR(pg_catalog.=) pg_catalog.pg_typeof(NULL::atomicphase_key_history)::pg_catalog.oid);
    v_grantee text;
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'citus'::pg_catalog.name) THEN
        IF EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid OPERATOR(pg_catalog.=) v_keys) THEN
            PERFORM create_distributed_table(v_history, 'scope', colocate_with := v_keys::text);
        END IF;
    END IF;
    -- Each role granted UPDATE or DELETE on the key table (PUBLIC too,
    -- where it is) gets SELECT, INSERT, UPDATE and DELETE on the history,
    -- which the functions below write as the role that calls them (a
    -- previous release, running as such a role while this one rolls out,
    -- thus keeps working). A role granted the key table later needs them
    -- too (docs/security-and-limits.md, "Database roles").
    FOR v_grantee IN
        SELECT DISTINCT CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0::pg_catalog.oid THEN 'PUBLIC'
                             ELSE pg_catalog.quote_ident(r.rolname::pg_catalog.text) END
        FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
        LEFT JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) a.grantee
        WHERE c.oid OPERATOR(pg_catalog.=) v_keys::pg_catalog.oid
          AND a.privilege_type OPERATOR(pg_catalog.=) ANY ('{UPDATE,DELETE}'::pg_catalog.text[])
          AND a.grantee OPERATOR(pg_catalog.<>) c.relowner
    LOOP
        EXECUTE pg_catalog.format('GRANT SELECT, INSERT, UPDATE, DELETE ON %s TO %s', v_history, v_grantee);
    END LOOP;
END
$$;

-- atomicphase_refuse raises code with message, and returns nothing: the
-- one function a plain statement of the library's calls, and only on the
-- branch that refuses (a key found that was to be recorded, a claim taken
-- by another transaction, a checkpoint that lost its lock), so that the
-- statement ends its batch there. A request that succeeds runs none.
CREATE FUNCTION atomicphase_refuse(p_code text, p_message text)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = p_code, MESSAGE = p_message;
END
$$;

-- atomicphase_state_name is a state's name in the history and the
-- console: running, waiting, unknown, parked, finished.
CREATE FUNCTION atomicphase_state_name(p_status "char")
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE p_status WHEN 'r' THEN 'running' WHEN 'w' THEN 'waiting' WHEN 'u' THEN 'unknown'
                         WHEN 'p' THEN 'parked' WHEN 'f' THEN 'finished' END
$$;

-- atomicphase_key_event writes an event of a key's history, when the key
-- moved off the happy path or along it after: p_event names it, or, when
-- NULL, it is named by the change (from p_from to p_to): a running key
-- left waiting failed; one left unknown or parked is so; a key taken is
-- resumed (or taken over, from a holder whose lease ran out: named by the
-- caller); a parked key made waiting or unknown is unparked; an unknown
-- outcome settled with no attempt holding the key is settled. A key keeps
-- its newest 1000 events; a finished key none of its error texts (they
-- may quote what the client sent, as last_error may).
CREATE FUNCTION atomicphase_key_event(
    p_scope text, p_key text, p_event text, p_from "char", p_to "char",
    p_recovery_point text, p_attempt integer, p_lock_token bigint, p_error text
) RETURNS void LANGUAGE plpgsql AS $$
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
$$;

-- The functions below are those a release calls to write a key, each
-- under the name and arguments it had (a previous release calls them),
-- each now writing the key's status, and its history when the key leaves
-- the happy path. Each write names, in a comment on its status test, the
-- operation of key_state.go's table whose from-states it lists
-- (TestKeyStateTableIsTheDatabases reads them). Each compares values of
-- one type only, so that nothing planted on the search path stands in for
-- a built-in (docs/security-and-limits.md, "Database roles").

-- atomicphase_acquire as in migration 016, the key's state stored: a new
-- key is recorded running; a key nobody holds (waiting, unknown, parked
-- after its attempts, or running with its lease run out) is taken, and the
-- take goes in its history. A key whose reconciliation is backing off
-- (unknown, tried since it became so: updated_at after unknown_at, and
-- resting until next_attempt_at) is held until then, as a live attempt's
-- is: a client's retry is refused, told when to come back, and counts no
-- attempt. A refusal of a key no live lease holds (only such a backoff,
-- or a foreign call's quiet period) sets took_over, which means nothing
-- else on a refusal (a previous release reads it only when it acquired):
-- nothing changes before lock_expires_in, which is when to retry.
CREATE OR REPLACE FUNCTION atomicphase_acquire(
    p_scope text, p_key text, p_workflow text, p_fingerprint bytea,
    p_method text, p_path text, p_state bytea, p_lock_timeout_us bigint,
    p_lock_token bigint, p_max_unfinished integer,
    OUT acquired boolean, OUT workflow text, OUT fingerprint bytea,
    OUT recovery_point text, OUT next_phase text, OUT state bytea,
    OUT lock_token bigint, OUT lock_expires_in float8, OUT downstream_salt uuid,
    OUT attempts integer, OUT took_over boolean, OUT over_limit boolean,
    OUT response_status integer, OUT response_header jsonb, OUT response_body bytea
) LANGUAGE plpgsql AS $$
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
$$;

-- atomicphase_admit as in migration 008, a parked key told by its status.
CREATE OR REPLACE FUNCTION atomicphase_admit(
    p_scope text, p_key text, p_workflow text, p_fingerprint bytea,
    p_method text, p_path text, p_state bytea, p_lock_timeout_us bigint,
    p_lock_token bigint, p_max_unfinished integer,
    OUT acquired boolean, OUT workflow text, OUT fingerprint bytea,
    OUT recovery_point text, OUT next_phase text, OUT state bytea,
    OUT lock_token bigint, OUT lock_expires_in float8, OUT downstream_salt uuid,
    OUT attempts integer, OUT took_over boolean, OUT over_limit boolean,
    OUT response_status integer, OUT response_header jsonb, OUT response_body bytea,
    OUT parked boolean
) LANGUAGE plpgsql AS $$
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
$$;

-- atomicphase_take as in migration 016 (Resume, the sweep, a verdict's
-- resolution), the key's state stored and the take in its history.
CREATE OR REPLACE FUNCTION atomicphase_take(
    p_scope text, p_key text, p_lock_timeout_us bigint, p_lock_token bigint, p_sweep boolean
) RETURNS TABLE (
    workflow text, recovery_point text, next_phase text, state bytea,
    lock_token bigint, downstream_salt uuid, attempts integer, took_over boolean
) LANGUAGE plpgsql AS $$
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
$$;

-- atomicphase_release, in its three forms, as in migration 015: the key
-- nobody holds now, waiting, unknown (its outcome unknown, now or still)
-- or parked, and the failure in its history.
CREATE OR REPLACE FUNCTION atomicphase_release(
    p_scope text, p_key text, p_lock_token bigint,
    p_error text, p_retry_in_us bigint, p_park boolean, p_unknown boolean, p_final boolean,
    p_called boolean
) RETURNS SETOF boolean LANGUAGE plpgsql AS $$
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
$$;
CREATE OR REPLACE FUNCTION atomicphase_release(
    p_scope text, p_key text, p_lock_token bigint,
    p_error text, p_retry_in_us bigint, p_park boolean, p_unknown boolean
) RETURNS SETOF boolean LANGUAGE sql AS $$
    SELECT r FROM atomicphase_release(
        p_scope, p_key, p_lock_token, p_error, p_retry_in_us, p_park, p_unknown, false, p_park) AS r
$$;
CREATE OR REPLACE FUNCTION atomicphase_release(
    p_scope text, p_key text, p_lock_token bigint,
    p_error text, p_retry_in_us bigint, p_park boolean, p_unknown boolean, p_final boolean
) RETURNS SETOF boolean LANGUAGE sql AS $$
    SELECT r FROM atomicphase_release(
        p_scope, p_key, p_lock_token, p_error, p_retry_in_us, p_park, p_unknown, p_final, p_park) AS r
$$;

-- atomicphase_renew as in migration 007: a running key's lease renewed,
-- and its call marked.
CREATE OR REPLACE FUNCTION atomicphase_renew(
    p_scope text, p_key text, p_lock_token bigint, p_lease_us bigint, p_call_us bigint
) RETURNS SETOF boolean LANGUAGE plpgsql AS $$
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
$$;

-- atomicphase_checkpoint as in migration 016 (a previous release's, and
-- this one's on Citus): a running key's recovery point, finished with the
-- response; the finish of a key that went wrong in its history.
CREATE OR REPLACE FUNCTION atomicphase_checkpoint(
    p_scope text, p_key text, p_lock_token bigint,
    p_recovery_point text, p_next_phase text, p_state bytea,
    p_status integer, p_header jsonb, p_body bytea
) RETURNS void LANGUAGE plpgsql AS $$
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
$$;

-- atomicphase_record as in migration 007 (the previous release's
-- recording, through its form of migration 011): a new key, running.
CREATE OR REPLACE FUNCTION atomicphase_record(
    p_scope text, p_key text, p_workflow text, p_fingerprint bytea,
    p_method text, p_path text, p_state bytea, p_lock_token bigint,
    p_max_unfinished integer, p_lease_us bigint
) RETURNS TABLE (downstream_salt uuid) LANGUAGE plpgsql AS $$
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
$$;

-- atomicphase_record_unit as in migration 012 (a previous release's
-- recording at its first unit's commit): a new key, running, or finished
-- when the unit responds.
CREATE OR REPLACE FUNCTION atomicphase_record_unit(
    p_scope text, p_key text, p_workflow text, p_fingerprint bytea,
    p_method text, p_path text, p_lock_token bigint, p_lease_us bigint, p_version text,
    p_recovery_point text, p_next_phase text, p_state bytea,
    p_status integer, p_header jsonb, p_body bytea
) RETURNS TABLE (downstream_salt uuid) LANGUAGE plpgsql AS $$
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
$$;

-- atomicphase_unpark as in migration 016 (a previous release's Unpark,
-- which takes any unfinished key): a parked key made waiting (or unknown,
-- its outcome still so), its unpark in its history; another's backoff
-- cleared.
CREATE OR REPLACE FUNCTION atomicphase_unpark(p_scope text, p_key text)
RETURNS SETOF boolean LANGUAGE plpgsql AS $$
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
$$;

-- atomicphase_schedule makes an unfinished key due at once, marked as
-- atomicphase_unpark marks it, for this release's Unpark and MakeDue:
-- with p_unpark, a parked key only, unparked with a fresh budget of
-- attempts (and its unpark in its history); without, a key that is not
-- parked, its backoff cleared and its attempts as they are. It returns
-- true when it changed the key, and nothing for any other.
CREATE FUNCTION atomicphase_schedule(p_scope text, p_key text, p_unpark boolean)
RETURNS SETOF boolean LANGUAGE plpgsql AS $$
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
$$;

-- atomicphase_record_verdict and atomicphase_record_resolution as in
-- migration 016: an operator's verdict on an unknown outcome, which makes
-- the key due (waiting for its attempt to take the verdict; running while
-- a stale holder keeps it) with a fresh budget of attempts, but for a key
-- parked for good (a permanent failure, a panic: a bug in its code): the
-- verdict settles its call's outcome, and the key stays parked, with its
-- attempts, until an operator unparks it; the attempt that resumes it
-- then takes the verdict. The verdict goes in the key's history.
CREATE OR REPLACE FUNCTION atomicphase_record_verdict(
    p_scope text, p_key text, p_happened boolean, p_note text, p_lock_timeout_us bigint, p_result jsonb
) RETURNS TABLE (workflow text, recorded boolean) LANGUAGE plpgsql AS $$
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
$$;
CREATE OR REPLACE FUNCTION atomicphase_record_resolution(
    p_scope text, p_key text, p_happened boolean, p_note text, p_lock_timeout_us bigint
) RETURNS SETOF text LANGUAGE plpgsql AS $$
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
$$;

-- The guard on deletes: a DELETE of a key that may have paid (unfinished,
-- or parked with its outcome unknown or a call that may have gone out) is
-- refused (AP011; the statement is undone), unless its transaction says it
-- is a forced forget (atomicphase.forget_forced, which ForgetForced sets
-- after writing its audit entry) or, for a parked key and where the audit
-- trail is on the key's node (not on Citus), the trail records a forced
-- forget of it since it was parked (what a previous release's forced
-- forget writes before it deletes). Any session may set the setting: the
-- guard is against mistakes, not an access control. A deleted key's
-- history goes with it, whoever deletes it. It costs a request nothing:
-- its WHEN clause leaves out a key that finished first time (what the
-- reaper deletes), and no trigger fires on an INSERT or an UPDATE.
--
-- atomicphase_key_table_fired raises AP012 unless relation is the key
-- table or, on a Citus node, one of its shards: what the trigger
-- functions below check first, so that a role that attaches one of them
-- to a table of its own (a temporary table with the key table's columns)
-- gets an error, not the function's writes to the real tables.
CREATE FUNCTION atomicphase_key_table_fired(p_relation oid) RETURNS void
LANGUAGE plpgsql STABLE AS $$
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
$$;

CREATE FUNCTION atomicphase_key_delete() RETURNS trigger
LANGUAGE plpgsql AS $$
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
$$;

-- The search_path of the trigger's functions and of the history's writer:
-- the key table's schema, pg_temp last, whatever the writing session's
-- path holds (its name found from the table's row type: a schema's name
-- may be any identifier, which a string literal would have to quote). No
-- role but the owner may attach a trigger function to a table: firing one
-- asks for no EXECUTE, creating one does.
DO $$
DECLARE
    v_schema text := (SELECT n.nspname FROM pg_catalog.pg_type t
                      JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) t.typrelid
                      JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
                      WHERE t.oid OPERATOR(pg_catalog.=) pg_catalog.pg_typeof(NULL::idempotency_keys)::pg_catalog.oid);
BEGIN
    EXECUTE pg_catalog.format('ALTER FUNCTION %I.atomicphase_key_delete() SET search_path = %I, pg_temp', v_schema, v_schema);
    EXECUTE pg_catalog.format('ALTER FUNCTION %I.atomicphase_key_table_fired(oid) SET search_path = %I, pg_temp', v_schema, v_schema);
    EXECUTE pg_catalog.format('ALTER FUNCTION %I.atomicphase_key_event(text, text, text, "char", "char", text, integer, bigint, text) SET search_path = %I, pg_temp',
        v_schema, v_schema);
END
$$;
REVOKE EXECUTE ON FUNCTION atomicphase_key_delete() FROM PUBLIC;

-- On Citus, the key table may be distributed already: the trigger reads
-- only the row it fires for, and writes only its history, on its shard
-- (a setting of no effect elsewhere).
SET LOCAL citus.enable_unsafe_triggers = on;
CREATE TRIGGER atomicphase_key_delete
    AFTER DELETE ON idempotency_keys FOR EACH ROW
    WHEN (OLD.status <> 'f' OR OLD.attempts > 1 OR OLD.resolved_at IS NOT NULL)
    EXECUTE FUNCTION atomicphase_key_delete();

-- atomicphase:no-transaction
-- A request that succeeds first time writes two index entries (the primary
-- key and created_at) and finishes with a HOT update, once migration 018
-- drops the indexes whose predicates read response_status, or whose key is
-- finished_at (each made every finish write a new entry in it). Here, the
-- indexes that take their place: the sweep reads the keys that went wrong
-- (next_attempt_at set, migration 016; parked ones left out) and the
-- parked keys, each from a partial index whose predicate reads columns a
-- finish never changes; the reaper reads finished keys in creation order
-- (created_at). Built concurrently, outside a transaction, so that no
-- write to the key table waits; Migrate drops a build an interrupted run
-- left invalid and builds it again.
CREATE INDEX CONCURRENTLY IF NOT EXISTS idempotency_keys_waiting_idx ON idempotency_keys (next_attempt_at)
    WHERE next_attempt_at IS NOT NULL AND parked_at IS NULL;
CREATE INDEX CONCURRENTLY IF NOT EXISTS idempotency_keys_parked_idx ON idempotency_keys (parked_at)
    WHERE parked_at IS NOT NULL;
-- Room on each page for a key's finish to stay on it (a HOT update needs
-- its new version on the old one's page). It applies to pages written
-- from now on.
ALTER TABLE idempotency_keys SET (fillfactor = 70);

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
CREATE FUNCTION atomicphase_record_first(
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
$$;

-- atomicphase:no-transaction
-- The contract step of migrations 016 and 017: the indexes every request
-- paid for go, concurrently (no write waits). The previous release's
-- sweep, console and scope cap read them: apply this migration once no
-- process of that release is left (MigrateOpts.TargetVersion 17 during the
-- rollout, docs/operations.md, "Upgrades"); before that, they work, each
-- reading the table instead.
DROP INDEX CONCURRENTLY IF EXISTS idempotency_keys_due_idx;
DROP INDEX CONCURRENTLY IF EXISTS idempotency_keys_unfinished_scope_idx;
DROP INDEX CONCURRENTLY IF EXISTS idempotency_keys_finished_at_idx;
DROP INDEX CONCURRENTLY IF EXISTS idempotency_keys_parked_scope_idx;
DROP INDEX CONCURRENTLY IF EXISTS idempotency_keys_parked_at_idx;
