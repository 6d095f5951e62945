-- Back to migration 012: migration 008's atomicphase_acquire.
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
              AND coalesce(/* TEMPLATE: schema */atomicphase_held_until(k.locked_at, k.lease_us, k.call_until, p_lock_timeout_us) < v_now, true)
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
