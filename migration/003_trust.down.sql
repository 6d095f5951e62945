-- Back to jsonb state and a counting lock token. A finished key's cleared
-- state becomes {}; a state jsonb cannot hold (a NUL, say) makes this fail.
-- It refuses while unfinished keys have a downstream salt: the code before
-- this migration would derive their downstream keys without it, and repeat
-- a call already made under another key. Let them finish first.
DO $$
BEGIN
    IF EXISTS (SELECT FROM /* TEMPLATE: schema */idempotency_keys
               WHERE downstream_salt IS NOT NULL AND response_status IS NULL) THEN
        RAISE EXCEPTION 'unfinished idempotency keys have downstream salts; let them finish (or forget them) before migrating down';
    END IF;
END
$$;

DROP FUNCTION /* TEMPLATE: schema */atomicphase_acquire(text, text, text, bytea, text, text, bytea, bigint, bigint);
DROP FUNCTION /* TEMPLATE: schema */atomicphase_checkpoint(text, text, bigint, text, text, bytea, integer, jsonb, bytea);

ALTER TABLE /* TEMPLATE: schema */idempotency_keys
    DROP COLUMN last_error,
    DROP COLUMN parked_at,
    DROP COLUMN downstream_salt,
    ALTER COLUMN state TYPE jsonb USING coalesce(convert_from(state, 'UTF8')::jsonb, '{}'),
    ALTER COLUMN state SET NOT NULL;

-- atomicphase_acquire decides every case of an arriving request in one
-- statement and one round trip. A finished key (replay), another
-- fingerprint, or a live lock is answered by the primary-key read alone:
-- nothing is built, written or drawn. A new key, or an unfinished key that
-- is unlocked or whose lock is older than the lock timeout, goes through one
-- stale-lock-aware upsert that records it (or takes it over, renewing its
-- lock token) and returns where it stands. The upsert re-checks its WHERE
-- against the newest row version, so of two attempts racing for a key only
-- one gets it; the loser reads the row again and reports what it finds.
CREATE OR REPLACE FUNCTION /* TEMPLATE: schema */atomicphase_acquire(
    p_scope text, p_key text, p_workflow text, p_fingerprint bytea,
    p_method text, p_path text, p_state jsonb, p_lock_timeout_us bigint,
    OUT acquired boolean, OUT workflow text, OUT fingerprint bytea,
    OUT recovery_point text, OUT next_phase text, OUT state jsonb,
    OUT lock_token bigint, OUT lock_expires_in float8,
    OUT response_status integer, OUT response_header jsonb, OUT response_body bytea
) LANGUAGE plpgsql AS $$
DECLARE
    stale_before timestamptz := /* TEMPLATE: schema */atomicphase_stale_before(p_lock_timeout_us);
    held_since   timestamptz;
BEGIN
    acquired := false;
    FOR round IN 1..2 LOOP
        SELECT k.workflow, k.fingerprint, k.recovery_point, k.next_phase, k.lock_token,
               k.locked_at, k.response_status, k.response_header, k.response_body
        INTO workflow, fingerprint, recovery_point, next_phase, lock_token,
             held_since, response_status, response_header, response_body
        FROM /* TEMPLATE: schema */idempotency_keys k
        WHERE k.scope = p_scope AND k.idempotency_key = p_key;
        IF FOUND AND (response_status IS NOT NULL OR workflow <> p_workflow
                      OR fingerprint <> p_fingerprint
                      OR NOT /* TEMPLATE: schema */atomicphase_lock_takeable(held_since, stale_before)) THEN
            lock_expires_in := extract(epoch FROM held_since - stale_before)::float8;
            RETURN;
        END IF;

        INSERT INTO /* TEMPLATE: schema */idempotency_keys AS k
            (scope, idempotency_key, workflow, fingerprint, request_method, request_path, state, locked_at)
        VALUES (p_scope, p_key, p_workflow, p_fingerprint, p_method, p_path, p_state, now())
        ON CONFLICT (scope, idempotency_key) DO UPDATE
            SET locked_at = now(), lock_token = k.lock_token + 1, updated_at = now()
            WHERE k.response_status IS NULL AND k.workflow = p_workflow
              AND k.fingerprint = p_fingerprint
              AND /* TEMPLATE: schema */atomicphase_lock_takeable(k.locked_at, stale_before)
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
CREATE OR REPLACE FUNCTION /* TEMPLATE: schema */atomicphase_checkpoint(
    p_scope text, p_key text, p_lock_token bigint,
    p_recovery_point text, p_next_phase text, p_state jsonb,
    p_status integer, p_header jsonb, p_body bytea
) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE /* TEMPLATE: schema */idempotency_keys SET
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
