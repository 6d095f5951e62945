-- The console (migration 009): a verdict's result, the function that records
-- it, and the operators' audit trail. It builds no index on the key table
-- (the console's pages use the indexes there are), so it runs in a
-- transaction like the migrations before it.

-- An operator's "happened" verdict may carry the call's result (the label id
-- the downstream's support read out, say): JSON the phase's reconcile
-- function reads from ForeignCall.OperatorResult and records in the state,
-- as the call function would have. NULL when the verdict came without one.
ALTER TABLE /* TEMPLATE: schema */idempotency_keys ADD COLUMN resolved_result jsonb;

-- atomicphase_record_verdict records an operator's verdict, and the call's
-- result (or NULL), on the foreign call an unfinished key waits on, for the
-- phase after its current recovery point; makes the key due at once; and,
-- as atomicphase_unpark does, gives it a fresh budget of attempts: a key
-- parked because its reconciliation failed Config.MaxAttempts times would
-- otherwise be parked again by the sweep before the verdict is read. It
-- returns one row for an unfinished key nobody holds: its workflow, and
-- whether the verdict was recorded, which it is only when the key waits on
-- an unknown outcome (unknown_at set); no row when the key is finished,
-- absent, or held by a live attempt.
CREATE FUNCTION /* TEMPLATE: schema */atomicphase_record_verdict(
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
      AND coalesce(/* TEMPLATE: schema */atomicphase_held_until(k.locked_at, k.lease_us, k.call_until, p_lock_timeout_us) < v_now, true)
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

-- The verdict of an older library (which knows no result) clears any result
-- an earlier verdict left, so that it is never taken for this one's; it is
-- otherwise migration 007's function.
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
      AND coalesce(/* TEMPLATE: schema */atomicphase_held_until(k.locked_at, k.lease_us, k.call_until, p_lock_timeout_us) < v_now, true)
    RETURNING k.workflow INTO v_workflow;
    IF FOUND THEN
        RETURN NEXT v_workflow;
    END IF;
END
$$;

-- The operators' audit trail: every action an operator takes on a key from
-- the console, its API or the CLI (resume, unpark, forget, resolve), with
-- who (as the embedding service or the CLI's environment names them), when,
-- the key and the note. A table of its own: it outlives the key's row, which
-- forget and the reap delete. Read by (scope, key), newest first.
CREATE TABLE /* TEMPLATE: schema */atomicphase_audit (
    scope           text        NOT NULL,
    idempotency_key text        NOT NULL,
    id              bigint      GENERATED ALWAYS AS IDENTITY,
    at              timestamptz NOT NULL DEFAULT now(),
    actor           text        NOT NULL,
    action          text        NOT NULL,
    note            text        NOT NULL DEFAULT '',
    -- What the action carried: a verdict and the call's result, a bulk
    -- action's filter.
    detail          jsonb,
    -- A key's trail is read by (scope, key), newest first: the primary
    -- key's index, built with the new, empty table.
    PRIMARY KEY (scope, idempotency_key, id)
);
