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
CREATE TABLE /* TEMPLATE: schema */atomicphase_sweep_watermark (
    name           text        PRIMARY KEY,
    created_before timestamptz NOT NULL,
    pending_before timestamptz,
    pending_xmax   xid8,
    -- On Citus, the workers' pg_snapshot_xmax at the plan, by node.
    pending_nodes  jsonb
);

-- Every unfinished key now marked, so the watermark may start here (with a
-- margin for transactions committing as this one runs).
UPDATE /* TEMPLATE: schema */idempotency_keys SET next_attempt_at = created_at
WHERE response_status IS NULL AND parked_at IS NULL AND next_attempt_at IS NULL;
INSERT INTO /* TEMPLATE: schema */atomicphase_sweep_watermark (name, created_before)
VALUES ('abandoned', now() - interval '5 minutes');

-- atomicphase_acquire as in migration 013, marking the key it takes over,
-- and holding a key whose reconciliation is backing off: one whose
-- foreign call's outcome is unknown (unknown_at), that an attempt has
-- tried to reconcile since (updated_at after unknown_at) and that rests
-- until next_attempt_at, is held until then, as a live attempt's is: a
-- client's retry is refused (and told when to come back), and counts no
-- attempt. Attempts count the library's tries, not a client's patience.
-- A refusal of a key no live lease holds (only such a backoff, or a
-- foreign call's quiet period) sets took_over, which means nothing else on
-- a refusal (a previous release reads it only when it acquired): nothing
-- changes before lock_expires_in, which is when to retry.
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
    v_backoff  timestamptz;
    v_lease    bigint;
BEGIN
    acquired := false;
    took_over := false;
    over_limit := false;
    attempts := 0;
    FOR round IN 1..2 LOOP
        SELECT k.workflow, k.fingerprint, k.recovery_point, k.next_phase, k.lock_token,
               k.locked_at, /* TEMPLATE: schema */atomicphase_held_until(k.locked_at, k.lease_us, k.call_until, p_lock_timeout_us),
               /* TEMPLATE: schema */atomicphase_lock_expires(k.locked_at, k.lease_us, k.call_until, p_lock_timeout_us, v_now),
               k.attempts, k.response_status, k.response_header, k.response_body,
               CASE WHEN k.unknown_at IS NOT NULL AND k.locked_at IS NULL AND k.updated_at > k.unknown_at
                    THEN k.next_attempt_at END,
               coalesce(k.lease_us, p_lock_timeout_us)
        INTO workflow, fingerprint, recovery_point, next_phase, lock_token,
             held_since, v_until, v_expires, attempts, response_status, response_header, response_body,
             v_backoff, v_lease
        FROM /* TEMPLATE: schema */idempotency_keys k
        WHERE k.scope = p_scope AND k.idempotency_key = p_key;
        IF FOUND AND v_backoff > v_now AND v_backoff > coalesce(v_until, '-infinity') THEN
            -- Held by its reconciliation's backoff (above).
            v_until := v_backoff;
            v_expires := v_backoff;
        END IF;
        IF FOUND AND (response_status IS NOT NULL OR workflow <> p_workflow
                      OR fingerprint <> p_fingerprint OR v_until >= v_now) THEN
            lock_expires_in := extract(epoch FROM v_expires - v_now)::float8;
            -- No live lease holds it (above).
            took_over := response_status IS NULL AND v_until >= v_now
                         AND NOT coalesce(v_now - held_since <= v_lease * interval '1 microsecond', false);
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
                attempts = k.attempts + 1, parked_at = NULL, next_attempt_at = v_now,
                lease_us = p_lock_timeout_us
            WHERE k.response_status IS NULL AND k.workflow = p_workflow
              AND (k.final_parked_at IS NULL OR k.final_parked_at IS DISTINCT FROM k.parked_at)
              AND k.fingerprint = p_fingerprint
              AND (k.locked_at IS NULL OR v_now - k.locked_at > coalesce(k.lease_us, p_lock_timeout_us) * interval '1 microsecond')
              AND (k.call_until IS NULL OR k.call_until < v_now)
              AND NOT (k.unknown_at IS NOT NULL AND k.locked_at IS NULL AND k.updated_at > k.unknown_at
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

-- atomicphase_take as in migration 014, marking the key it takes.
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
        next_attempt_at = v_now, attempts = k.attempts + 1, lease_us = p_lock_timeout_us
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

-- atomicphase_unpark as in migration 006, marking the key it unparks.
CREATE OR REPLACE FUNCTION /* TEMPLATE: schema */atomicphase_unpark(p_scope text, p_key text)
RETURNS SETOF boolean LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := now();
BEGIN
    UPDATE /* TEMPLATE: schema */idempotency_keys AS k
    SET parked_at = NULL, next_attempt_at = v_now, updated_at = v_now, attempts = 1
    WHERE k.scope = p_scope AND k.idempotency_key = p_key AND k.response_status IS NULL;
    IF FOUND THEN
        RETURN NEXT true;
    END IF;
END
$$;

-- atomicphase_schedule makes an unfinished key due at once, marked as
-- atomicphase_unpark marks it, for this release's Unpark and MakeDue:
-- with p_unpark, a parked key only, unparked with a fresh budget of
-- attempts; without, a key that is not parked, its backoff cleared and
-- its attempts as they are. It returns true when it changed the key, and
-- nothing for any other (atomicphase_unpark, which a previous release
-- calls, takes either and resets the attempts of both).
CREATE FUNCTION /* TEMPLATE: schema */atomicphase_schedule(p_scope text, p_key text, p_unpark boolean)
RETURNS SETOF boolean LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := now();
BEGIN
    UPDATE /* TEMPLATE: schema */idempotency_keys AS k
    SET parked_at = NULL, next_attempt_at = v_now, updated_at = v_now,
        attempts = CASE WHEN p_unpark THEN 1 ELSE k.attempts END
    WHERE k.scope = p_scope AND k.idempotency_key = p_key AND k.response_status IS NULL
      AND (k.parked_at IS NOT NULL) = p_unpark;
    IF FOUND THEN
        RETURN NEXT true;
    END IF;
END
$$;

-- atomicphase_record_verdict and atomicphase_record_resolution as in
-- migration 014, marking the key they make due. A key parked for good (a
-- permanent failure, a panic: a bug in its code) is not made due: the
-- verdict settles its call's outcome, and the key stays parked, with its
-- attempts, until an operator unparks it once the bug is fixed; the
-- attempt that resumes it then takes the verdict.
CREATE OR REPLACE FUNCTION /* TEMPLATE: schema */atomicphase_record_verdict(
    p_scope text, p_key text, p_happened boolean, p_note text, p_lock_timeout_us bigint, p_result jsonb
) RETURNS TABLE (workflow text, recorded boolean) LANGUAGE plpgsql AS $$
DECLARE
    v_now        timestamptz := now();
BEGIN
    UPDATE /* TEMPLATE: schema */idempotency_keys AS k
    SET resolved_after = k.recovery_point, resolved_happened = p_happened, resolved_note = p_note,
        resolved_result = p_result, resolved_at = v_now,
        parked_at = CASE WHEN k.final_parked_at = k.parked_at THEN k.parked_at END,
        next_attempt_at = CASE WHEN k.final_parked_at = k.parked_at THEN k.next_attempt_at ELSE v_now END,
        updated_at = v_now, attempts = CASE WHEN k.final_parked_at = k.parked_at THEN k.attempts ELSE 1 END
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
        resolved_result = NULL, resolved_at = v_now,
        parked_at = CASE WHEN k.final_parked_at = k.parked_at THEN k.parked_at END,
        next_attempt_at = CASE WHEN k.final_parked_at = k.parked_at THEN k.next_attempt_at ELSE v_now END,
        updated_at = v_now
    WHERE k.scope = p_scope AND k.idempotency_key = p_key AND k.response_status IS NULL
      AND (k.locked_at IS NULL OR v_now - k.locked_at > coalesce(k.lease_us, p_lock_timeout_us) * interval '1 microsecond')
      AND (k.call_until IS NULL OR k.call_until < v_now)
    RETURNING k.workflow INTO v_workflow;
    IF FOUND THEN
        RETURN NEXT v_workflow;
    END IF;
END
$$;

-- atomicphase_checkpoint as in migration 007, clearing the mark when the
-- key finishes (a no-op, and no change to an indexed column, for a key
-- that never went wrong).
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
        next_attempt_at = CASE WHEN p_status IS NULL THEN next_attempt_at END,
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
