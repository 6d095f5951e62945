-- Back to migration 014: the nine-argument release and called_at go, and
-- the seven- and eight-argument releases are as migrations 006 and 008
-- defined them.

DROP FUNCTION IF EXISTS /* TEMPLATE: schema */atomicphase_release(
    text, text, bigint, text, bigint, boolean, boolean, boolean, boolean);

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
        unknown_at = CASE WHEN p_unknown THEN coalesce(k.unknown_at, v_now) ELSE k.unknown_at END
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
        unknown_at = CASE WHEN p_unknown THEN coalesce(k.unknown_at, v_now) ELSE k.unknown_at END
    WHERE k.scope = p_scope AND k.idempotency_key = p_key AND k.lock_token = p_lock_token
      AND k.response_status IS NULL;
    IF FOUND THEN
        RETURN NEXT true;
    END IF;
END
$$;

ALTER TABLE /* TEMPLATE: schema */idempotency_keys DROP COLUMN IF EXISTS called_at;
