-- called_at: when a foreign call of the key may first have gone out, as
-- the attempt that released the key knew it (a call sent, a foreign phase
-- committed, or an earlier attempt's call resumed into), kept until the
-- key is finished. A parked key with it set may have paid: forgetting or
-- reaping it would let the client's retry run as a new request, with new
-- downstream keys, and pay again. Written only when an attempt fails,
-- never on a request that succeeds.
ALTER TABLE /* TEMPLATE: schema */idempotency_keys ADD COLUMN called_at timestamptz;

-- atomicphase_release with p_called: migration 008's release, which also
-- records that a foreign call of the key may have gone out. The eight- and
-- seven-argument functions a previous release calls follow.
CREATE FUNCTION /* TEMPLATE: schema */atomicphase_release(
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

-- The releases a previous release calls (seven and eight arguments), as
-- migrations 006 and 008 define them, but parking a key records that a
-- call may have gone out: a process of the previous release does not know
-- whether one did, and a key it parks must not be given up as if none had.
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

-- Keys parked before this migration may have paid: nothing recorded
-- whether a call of theirs went out, so each counts as if one had.
-- (Parked keys are few, and found through the parked indexes.)
UPDATE /* TEMPLATE: schema */idempotency_keys SET called_at = parked_at
WHERE response_status IS NULL AND parked_at IS NOT NULL AND called_at IS NULL;
