-- atomicphase_take (migration 007), atomicphase_record_verdict and
-- atomicphase_record_resolution (migration 009), with the held-until rule
-- in their UPDATE written with immutable operators only, as migration 013
-- did for atomicphase_acquire: Citus refuses an UPDATE of a distributed
-- table whose CASE or COALESCE calls anything not IMMUTABLE, and
-- atomicphase_held_until's timestamptz + interval is only stable, so on
-- Citus every take (the sweep's, Resume's) and every operator verdict
-- failed. The same rule: a key may be taken when its lease ended (or it is
-- unlocked) and no foreign call's quiet period is still to come.

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
