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
CREATE FUNCTION /* TEMPLATE: schema */atomicphase_record(
    p_scope text, p_key text, p_workflow text, p_fingerprint bytea,
    p_method text, p_path text, p_state bytea, p_lock_token bigint,
    p_max_unfinished integer
) RETURNS TABLE (downstream_salt uuid) LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := now();
BEGIN
    IF p_max_unfinished IS NOT NULL AND p_max_unfinished <= (
            SELECT count(*) FROM (
                SELECT 1 FROM /* TEMPLATE: schema */idempotency_keys u
                WHERE u.scope = p_scope AND u.response_status IS NULL AND u.parked_at IS NULL
                LIMIT p_max_unfinished) AS capped) THEN
        RETURN;
    END IF;
    INSERT INTO /* TEMPLATE: schema */idempotency_keys AS k
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
CREATE FUNCTION /* TEMPLATE: schema */atomicphase_take(
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

-- atomicphase_release releases a lock the caller holds with p_lock_token,
-- leaving the recovery point where the last committed phase put it, and
-- returns a row (true) when it released one. With p_error it records why
-- the attempt failed and, with p_retry_in_us, when the sweep may try the
-- key again; p_park parks the key for an operator; p_unknown marks the
-- outcome of its foreign call unknown. Like a checkpoint it is fenced by
-- the token: a release by an attempt that lost the key changes nothing.
CREATE FUNCTION /* TEMPLATE: schema */atomicphase_release(
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
CREATE FUNCTION /* TEMPLATE: schema */atomicphase_unpark(p_scope text, p_key text)
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

-- atomicphase_record_resolution records an operator's verdict on the
-- foreign call an unfinished key waits on, for the phase after its current
-- recovery point, and makes the key due at once. It returns the key's
-- workflow, or no row when the key is finished, absent, or held by a live
-- attempt.
CREATE FUNCTION /* TEMPLATE: schema */atomicphase_record_resolution(
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
