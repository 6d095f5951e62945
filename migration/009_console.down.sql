-- Back to migration 008: the audit trail, the verdict's result and
-- atomicphase_record_verdict go; atomicphase_record_resolution is 007's
-- again.
DROP TABLE /* TEMPLATE: schema */atomicphase_audit;
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
DROP FUNCTION /* TEMPLATE: schema */atomicphase_record_verdict(text, text, boolean, text, bigint, jsonb);
ALTER TABLE /* TEMPLATE: schema */idempotency_keys DROP COLUMN resolved_result;
