-- Back to migration 016: no stored state, no history, and the functions
-- as the previous release left them (migrations 007 to 015). Keys keep
-- what their columns say.
SET LOCAL citus.enable_unsafe_triggers = on;
DROP TRIGGER IF EXISTS atomicphase_key_delete ON /* TEMPLATE: schema */idempotency_keys;
DROP FUNCTION IF EXISTS /* TEMPLATE: schema */atomicphase_key_delete();
DROP FUNCTION IF EXISTS /* TEMPLATE: schema */atomicphase_key_table_fired(oid);
DROP FUNCTION IF EXISTS /* TEMPLATE: schema */atomicphase_schedule(text, text, boolean);
CREATE OR REPLACE FUNCTION /* TEMPLATE: schema */atomicphase_acquire(
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
               k.locked_at, /* TEMPLATE: schema */atomicphase_held_until(k.locked_at, k.lease_us, k.call_until, p_lock_timeout_us),
               /* TEMPLATE: schema */atomicphase_lock_expires(k.locked_at, k.lease_us, k.call_until, p_lock_timeout_us, v_now),
               k.attempts, k.response_status, k.response_header, k.response_body
        INTO workflow, fingerprint, recovery_point, next_phase, lock_token,
             held_since, v_until, v_expires, attempts, response_status, response_header, response_body
        FROM /* TEMPLATE: schema */idempotency_keys k
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
                    SELECT 1 FROM /* TEMPLATE: schema */idempotency_keys u
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

        INSERT INTO /* TEMPLATE: schema */idempotency_keys AS k
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
CREATE OR REPLACE FUNCTION /* TEMPLATE: schema */atomicphase_admit(
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
    FROM /* TEMPLATE: schema */idempotency_keys k
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
                SELECT 1 FROM /* TEMPLATE: schema */idempotency_keys u
                WHERE u.scope = p_scope AND u.response_status IS NULL AND u.parked_at IS NOT NULL
                LIMIT v_max) AS capped))::integer;
    END IF;
    SELECT a.acquired, a.workflow, a.fingerprint, a.recovery_point, a.next_phase, a.state,
           a.lock_token, a.lock_expires_in, a.downstream_salt, a.attempts, a.took_over,
           a.over_limit, a.response_status, a.response_header, a.response_body, false
    INTO acquired, workflow, fingerprint, recovery_point, next_phase, state,
         lock_token, lock_expires_in, downstream_salt, attempts, took_over,
         over_limit, response_status, response_header, response_body, parked
    FROM /* TEMPLATE: schema */atomicphase_acquire(
        p_scope, p_key, p_workflow, p_fingerprint, p_method, p_path, p_state,
        p_lock_timeout_us, p_lock_token, v_max) AS a;
END
$$;
CREATE OR REPLACE FUNCTION /* TEMPLATE: schema */atomicphase_take(
    p_scope text, p_key text, p_lock_timeout_us bigint, p_lock_token bigint, p_sweep boolean
) RETURNS TABLE (
    workflow text, recovery_point text, next_phase text, state bytea,
    lock_token bigint, downstream_salt uuid, attempts integer, took_over boolean
) LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := now();
BEGIN
    UPDATE /* TEMPLATE: schema */idempotency_keys AS k
    SET locked_at = v_now, lock_token = p_lock_token, updated_at = v_now, parked_at = NULL,
        next_attempt_at = NULL, attempts = k.attempts + 1, lease_us = p_lock_timeout_us
    FROM (SELECT b.locked_at FROM /* TEMPLATE: schema */idempotency_keys b
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
CREATE OR REPLACE FUNCTION /* TEMPLATE: schema */atomicphase_release(
    p_scope text, p_key text, p_lock_token bigint,
    p_error text, p_retry_in_us bigint, p_park boolean, p_unknown boolean, p_final boolean,
    p_called boolean
) RETURNS SETOF boolean LANGUAGE plpgsql AS $$
DECLARE
    v_now  timestamptz := now();
    v_next timestamptz := v_now + p_retry_in_us * interval '1 microsecond';
BEGIN
    UPDATE /* TEMPLATE: schema */idempotency_keys AS k SET
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
CREATE OR REPLACE FUNCTION /* TEMPLATE: schema */atomicphase_release(
    p_scope text, p_key text, p_lock_token bigint,
    p_error text, p_retry_in_us bigint, p_park boolean, p_unknown boolean
) RETURNS SETOF boolean LANGUAGE plpgsql AS $$
DECLARE
    v_now  timestamptz := now();
    v_next timestamptz := v_now + p_retry_in_us * interval '1 microsecond';
BEGIN
    UPDATE /* TEMPLATE: schema */idempotency_keys AS k SET
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
CREATE OR REPLACE FUNCTION /* TEMPLATE: schema */atomicphase_release(
    p_scope text, p_key text, p_lock_token bigint,
    p_error text, p_retry_in_us bigint, p_park boolean, p_unknown boolean, p_final boolean
) RETURNS SETOF boolean LANGUAGE plpgsql AS $$
DECLARE
    v_now  timestamptz := now();
    v_next timestamptz := v_now + p_retry_in_us * interval '1 microsecond';
BEGIN
    UPDATE /* TEMPLATE: schema */idempotency_keys AS k SET
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
CREATE OR REPLACE FUNCTION /* TEMPLATE: schema */atomicphase_renew(
    p_scope text, p_key text, p_lock_token bigint, p_lease_us bigint, p_call_us bigint
) RETURNS SETOF boolean LANGUAGE plpgsql AS $$
DECLARE
    v_now  timestamptz := now();
    v_call timestamptz := v_now + p_call_us * interval '1 microsecond';
BEGIN
    UPDATE /* TEMPLATE: schema */idempotency_keys AS k
    SET locked_at = v_now, lease_us = p_lease_us,
        call_until = CASE WHEN p_call_us IS NULL THEN k.call_until ELSE v_call END
    WHERE k.scope = p_scope AND k.idempotency_key = p_key AND k.lock_token = p_lock_token
      AND k.locked_at IS NOT NULL AND k.response_status IS NULL;
    IF FOUND THEN
        RETURN NEXT true;
    END IF;
END
$$;
CREATE OR REPLACE FUNCTION /* TEMPLATE: schema */atomicphase_checkpoint(
    p_scope text, p_key text, p_lock_token bigint,
    p_recovery_point text, p_next_phase text, p_state bytea,
    p_status integer, p_header jsonb, p_body bytea
) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
    UPDATE /* TEMPLATE: schema */idempotency_keys SET
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
CREATE OR REPLACE FUNCTION /* TEMPLATE: schema */atomicphase_record(
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
                SELECT 1 FROM /* TEMPLATE: schema */idempotency_keys u
                WHERE u.scope = p_scope AND u.response_status IS NULL AND u.parked_at IS NULL
                LIMIT p_max_unfinished) AS capped) THEN
        RETURN;
    END IF;
    INSERT INTO /* TEMPLATE: schema */idempotency_keys AS k
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
CREATE OR REPLACE FUNCTION /* TEMPLATE: schema */atomicphase_record_unit(
    p_scope text, p_key text, p_workflow text, p_fingerprint bytea,
    p_method text, p_path text, p_lock_token bigint, p_lease_us bigint, p_version text,
    p_recovery_point text, p_next_phase text, p_state bytea,
    p_status integer, p_header jsonb, p_body bytea
) RETURNS TABLE (downstream_salt uuid) LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
    INSERT INTO /* TEMPLATE: schema */idempotency_keys AS k
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
CREATE OR REPLACE FUNCTION /* TEMPLATE: schema */atomicphase_unpark(p_scope text, p_key text)
RETURNS SETOF boolean LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := now();
BEGIN
    UPDATE /* TEMPLATE: schema */idempotency_keys AS k
    SET parked_at = NULL, next_attempt_at = NULL, updated_at = v_now, attempts = 1
    WHERE k.scope = p_scope AND k.idempotency_key = p_key AND k.response_status IS NULL;
    IF FOUND THEN
        RETURN NEXT true;
    END IF;
END
$$;
CREATE OR REPLACE FUNCTION /* TEMPLATE: schema */atomicphase_record_verdict(
    p_scope text, p_key text, p_happened boolean, p_note text, p_lock_timeout_us bigint, p_result jsonb
) RETURNS TABLE (workflow text, recorded boolean) LANGUAGE plpgsql AS $$
DECLARE
    v_now        timestamptz := now();
BEGIN
    UPDATE /* TEMPLATE: schema */idempotency_keys AS k
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
    FROM /* TEMPLATE: schema */idempotency_keys k
    WHERE k.scope = p_scope AND k.idempotency_key = p_key AND k.response_status IS NULL
      AND coalesce(/* TEMPLATE: schema */atomicphase_held_until(k.locked_at, k.lease_us, k.call_until, p_lock_timeout_us) < v_now, true);
    IF FOUND THEN
        RETURN NEXT;
    END IF;
END
$$;
CREATE OR REPLACE FUNCTION /* TEMPLATE: schema */atomicphase_record_resolution(
    p_scope text, p_key text, p_happened boolean, p_note text, p_lock_timeout_us bigint
) RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
    v_now        timestamptz := now();
    v_workflow   text;
BEGIN
    UPDATE /* TEMPLATE: schema */idempotency_keys AS k
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

DROP FUNCTION IF EXISTS /* TEMPLATE: schema */atomicphase_key_event(text, text, text, "char", "char", text, integer, bigint, text);
DROP FUNCTION IF EXISTS /* TEMPLATE: schema */atomicphase_state_name("char");
DROP FUNCTION IF EXISTS /* TEMPLATE: schema */atomicphase_refuse(text, text);
DROP TABLE IF EXISTS /* TEMPLATE: schema */atomicphase_key_history;
ALTER TABLE /* TEMPLATE: schema */idempotency_keys DROP COLUMN IF EXISTS status;
