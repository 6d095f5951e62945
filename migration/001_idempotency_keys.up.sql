-- One row per (scope, idempotency key): the request's fingerprint, where its
-- workflow stands (recovery point and state), who holds it (lock token and
-- time), and, once finished, the response to replay.
CREATE TABLE idempotency_keys (
    scope           text        NOT NULL,
    idempotency_key text        NOT NULL,
    workflow        text        NOT NULL,
    fingerprint     bytea       NOT NULL,
    request_method  text        NOT NULL,
    request_path    text        NOT NULL,
    recovery_point  text        NOT NULL DEFAULT 'started',
    -- Set when the last committed phase jumped: the phase to run next.
    next_phase      text,
    state           jsonb       NOT NULL,
    -- Renewed by every acquisition; every phase commit checks it (fencing).
    lock_token      bigint      NOT NULL DEFAULT 1,
    -- NULL when nobody holds the key; refreshed by every phase commit.
    locked_at       timestamptz,
    response_status integer,
    response_header jsonb,
    response_body   bytea,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz,
    PRIMARY KEY (scope, idempotency_key),
    CONSTRAINT idempotency_keys_finished_has_response
        CHECK ((recovery_point = 'finished') = (response_status IS NOT NULL))
);

-- For reaping old keys by age.
CREATE INDEX idempotency_keys_created_at_idx ON idempotency_keys (created_at);

-- atomicphase_checkpoint commits a phase's recovery point, state and (for the
-- last phase) response, but only while the caller still holds the lock token.
-- It raises SQLSTATE AP001 otherwise, so a pipelined COMMIT after it never
-- runs and the phase's own writes roll back with it: that is the fencing.
CREATE FUNCTION atomicphase_checkpoint(
    p_scope text, p_key text, p_lock_token bigint,
    p_recovery_point text, p_next_phase text, p_state jsonb,
    p_status integer, p_header jsonb, p_body bytea
) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE idempotency_keys SET
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
