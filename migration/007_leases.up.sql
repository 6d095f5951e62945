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
ALTER TABLE /* TEMPLATE: schema */idempotency_keys
    ADD COLUMN lease_us bigint,
    ADD COLUMN call_until timestamptz;

-- atomicphase_held_until is when a key stops being held: the end of its
-- lease, or of a foreign call's quiet period, whichever is later; NULL when
-- neither is set. A key whose held_until is NULL or past may be taken.
-- A plain SQL function, inlined into the statements that call it.
CREATE FUNCTION /* TEMPLATE: schema */atomicphase_held_until(
    p_locked_at timestamptz, p_lease_us bigint, p_call_until timestamptz, p_lock_timeout_us bigint
) RETURNS timestamptz LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT greatest(p_locked_at + coalesce(p_lease_us, p_lock_timeout_us) * interval '1 microsecond', p_call_until)
$$;

-- atomicphase_lock_expires is when a key's holding next changes, as a
-- refusal reports it (the Retry-After of a key in progress): the end of the
-- lease while it runs, or once it has ended (or when the key is unlocked),
-- the end of a foreign call's quiet period still to come. NULL when neither
-- is set.
CREATE FUNCTION /* TEMPLATE: schema */atomicphase_lock_expires(
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

-- atomicphase_record, as in migration 006, with the lease (p_lease_us) and
-- without waiting: it raises SQLSTATE AP002 at once when another
-- transaction is recording the same key at this moment (a duplicate of a
-- new key whose first transaction has not committed), so that the
-- duplicate's transaction, whose remaining statements the error skips,
-- ends at once and gives its connection back, instead of holding it while
-- it waits on the first transaction's uncommitted row. The transaction
-- advisory lock it takes is held until the recording commits or rolls
-- back.
CREATE FUNCTION /* TEMPLATE: schema */atomicphase_record(
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

-- atomicphase_take, as in migration 006, with the lease.
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
      AND coalesce(/* TEMPLATE: schema */atomicphase_held_until(k.locked_at, k.lease_us, k.call_until, p_lock_timeout_us) < v_now, true)
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
CREATE FUNCTION /* TEMPLATE: schema */atomicphase_renew(
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

-- atomicphase_checkpoint, as in migration 005, also clearing call_until:
-- the call whose result it records has ended.
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

-- atomicphase_record_resolution, as in migration 006, with the lease.
CREATE OR REPLACE FUNCTION /* TEMPLATE: schema */atomicphase_record_resolution(
    p_scope text, p_key text, p_happened boolean, p_note text, p_lock_timeout_us bigint
) RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
    v_now      timestamptz := now();
    v_workflow text;
BEGIN
    UPDATE /* TEMPLATE: schema */idempotency_keys AS k
    SET resolved_after = k.recovery_point, resolved_happened = p_happened, resolved_note = p_note,
        resolved_at = v_now, parked_at = NULL, next_attempt_at = NULL, updated_at = v_now
    WHERE k.scope = p_scope AND k.idempotency_key = p_key AND k.response_status IS NULL
      AND coalesce(/* TEMPLATE: schema */atomicphase_held_until(k.locked_at, k.lease_us, k.call_until, p_lock_timeout_us) < v_now, true)
    RETURNING k.workflow INTO v_workflow;
    IF FOUND THEN
        RETURN NEXT v_workflow;
    END IF;
END
$$;
