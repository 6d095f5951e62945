-- Unknown outcomes. A foreign call to a downstream without idempotency keys
-- that failed (a timeout, a lost answer, a 5xx that may have executed) may
-- or may not have taken effect; until reconciliation tells, the key is
-- marked with when that became unknown, and next_attempt_at says when to
-- reconcile. The checkpoint that commits the phase clears the mark.
--
-- An operator can settle an unknown outcome by hand (the CLI's resolve):
-- the verdict is recorded in the row, for the phase after the recovery
-- point it was given at (resolved_after), and the next attempt that resumes
-- into that phase takes it (clearing resolved_after) instead of asking the
-- reconcile function. resolved_happened, resolved_note and resolved_at stay
-- as the record of what was decided.
ALTER TABLE /* TEMPLATE: schema */idempotency_keys
    ADD COLUMN unknown_at timestamptz,
    ADD COLUMN resolved_after text,
    ADD COLUMN resolved_happened boolean,
    ADD COLUMN resolved_note text,
    ADD COLUMN resolved_at timestamptz;

-- atomicphase_checkpoint commits a phase's recovery point, state and (for the
-- last phase) response, but only while the caller still holds the lock token.
-- It raises SQLSTATE AP001 otherwise, so a pipelined COMMIT after it never
-- runs and the phase's own writes roll back with it: that is the fencing.
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
