-- Back to migration 006: locks judged by the reader's lock timeout alone.
DROP FUNCTION /* TEMPLATE: schema */atomicphase_renew(text, text, bigint, bigint, bigint);
DROP FUNCTION /* TEMPLATE: schema */atomicphase_record(text, text, text, bytea, text, text, bytea, bigint, integer, bigint);

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
    v_now        timestamptz := now();
    stale_before timestamptz := /* TEMPLATE: schema */atomicphase_stale_before(p_lock_timeout_us);
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
        FROM /* TEMPLATE: schema */idempotency_keys k
        WHERE k.scope = p_scope AND k.idempotency_key = p_key;
        IF FOUND AND (response_status IS NOT NULL OR workflow <> p_workflow
                      OR fingerprint <> p_fingerprint
                      OR NOT /* TEMPLATE: schema */atomicphase_lock_takeable(held_since, stale_before)) THEN
            lock_expires_in := extract(epoch FROM held_since - stale_before)::float8;
            RETURN;
        END IF;
        took_over := FOUND AND held_since IS NOT NULL;
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
             state, lock_token, locked_at)
        VALUES (p_scope, p_key, p_workflow, p_fingerprint, p_method, p_path,
                p_state, p_lock_token, v_now)
        ON CONFLICT (scope, idempotency_key) DO UPDATE
            SET locked_at = v_now, lock_token = p_lock_token, updated_at = v_now,
                attempts = k.attempts + 1, parked_at = NULL, next_attempt_at = NULL
            WHERE k.response_status IS NULL AND k.workflow = p_workflow
              AND k.fingerprint = p_fingerprint
              AND /* TEMPLATE: schema */atomicphase_lock_takeable(k.locked_at, stale_before)
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

CREATE OR REPLACE FUNCTION /* TEMPLATE: schema */atomicphase_take(
    p_scope text, p_key text, p_lock_timeout_us bigint, p_lock_token bigint, p_sweep boolean
) RETURNS TABLE (
    workflow text, recovery_point text, next_phase text, state bytea,
    lock_token bigint, downstream_salt uuid, attempts integer, took_over boolean
) LANGUAGE plpgsql AS $$
DECLARE
    v_now        timestamptz := now();
    stale_before timestamptz := /* TEMPLATE: schema */atomicphase_stale_before(p_lock_timeout_us);
BEGIN
    UPDATE /* TEMPLATE: schema */idempotency_keys AS k
    SET locked_at = v_now, lock_token = p_lock_token, updated_at = v_now, parked_at = NULL,
        next_attempt_at = NULL, attempts = k.attempts + 1
    FROM (SELECT b.locked_at FROM /* TEMPLATE: schema */idempotency_keys b
          WHERE b.scope = p_scope AND b.idempotency_key = p_key) AS before
    WHERE k.scope = p_scope AND k.idempotency_key = p_key AND k.response_status IS NULL
      AND /* TEMPLATE: schema */atomicphase_lock_takeable(k.locked_at, stale_before)
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

CREATE OR REPLACE FUNCTION /* TEMPLATE: schema */atomicphase_record_resolution(
    p_scope text, p_key text, p_happened boolean, p_note text, p_lock_timeout_us bigint
) RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
    v_now        timestamptz := now();
    stale_before timestamptz := /* TEMPLATE: schema */atomicphase_stale_before(p_lock_timeout_us);
    v_workflow   text;
BEGIN
    UPDATE /* TEMPLATE: schema */idempotency_keys AS k
    SET resolved_after = k.recovery_point, resolved_happened = p_happened, resolved_note = p_note,
        resolved_at = v_now, parked_at = NULL, next_attempt_at = NULL, updated_at = v_now
    WHERE k.scope = p_scope AND k.idempotency_key = p_key AND k.response_status IS NULL
      AND /* TEMPLATE: schema */atomicphase_lock_takeable(k.locked_at, stale_before)
    RETURNING k.workflow INTO v_workflow;
    IF FOUND THEN
        RETURN NEXT v_workflow;
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

DROP FUNCTION /* TEMPLATE: schema */atomicphase_lock_expires(timestamptz, bigint, timestamptz, bigint, timestamptz);
DROP FUNCTION /* TEMPLATE: schema */atomicphase_held_until(timestamptz, bigint, timestamptz, bigint);

ALTER TABLE /* TEMPLATE: schema */idempotency_keys DROP COLUMN lease_us, DROP COLUMN call_until;
