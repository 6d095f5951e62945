-- A new key's recording in one statement, at the head of its first
-- unit's batch when that unit goes whole (every statement queued, one
-- implicit transaction): the claim's advisory lock and the key's INSERT
-- with the unit's checkpoint, together. The unit's own statements come
-- after it, so they never run for a key that exists, and a duplicate of a
-- key being recorded is refused at once (AP002), as the claim refuses it:
-- one statement fewer per new key; on Citus, where it runs on the worker
-- that holds the key's shard, with that node's clock and transaction id.
-- Expand only: a new function. A release that does not know it claims and
-- records as before, with the same lock.
CREATE FUNCTION /* TEMPLATE: schema */atomicphase_record_first(
    p_scope text, p_key text, p_workflow text, p_fingerprint bytea,
    p_method text, p_path text, p_lock_token bigint, p_lease_us bigint, p_version text,
    p_recovery_point text, p_next_phase text, p_state bytea,
    p_status integer, p_header jsonb, p_body bytea
) RETURNS TABLE (downstream_salt uuid) LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz;
BEGIN
    -- The transaction's id before the key's times: a sweep that plans its
    -- watermark after created_at was read waits for this transaction,
    -- which now runs the whole unit after it (atomicphase_record_unit
    -- runs last, after the unit's statements took an id).
    PERFORM txid_current();
    v_now := clock_timestamp();
    IF NOT pg_try_advisory_xact_lock(hashtextextended(p_scope || chr(31) || p_key, 7::bigint)) THEN
        RAISE EXCEPTION 'idempotency key % is being recorded by another request', p_key
            USING ERRCODE = 'AP002';
    END IF;
    -- As atomicphase_record_unit: the row as the checkpoint leaves it,
    -- written once; AP003 when the key exists. Written out rather than
    -- called: a nested call of atomicphase_record_unit cost about 6 µs of
    -- this statement's 60 (server CPU, pgbench, 8 rounds).
    INSERT INTO /* TEMPLATE: schema */idempotency_keys AS k
        (scope, idempotency_key, workflow, fingerprint, request_method, request_path,
         state, lock_token, locked_at, created_at, updated_at, lease_us, workflow_version,
         recovery_point, next_phase, response_status, response_header, response_body, finished_at, status)
    VALUES (p_scope, p_key, p_workflow, p_fingerprint, p_method, p_path,
            p_state, p_lock_token, CASE WHEN p_status IS NULL THEN v_now END, v_now, v_now, p_lease_us, p_version,
            p_recovery_point, p_next_phase, p_status, p_header, p_body,
            CASE WHEN p_status IS NOT NULL THEN v_now END, CASE WHEN p_status IS NULL THEN 'r' ELSE 'f' END)
    ON CONFLICT (scope, idempotency_key) DO NOTHING
    RETURNING k.downstream_salt INTO downstream_salt;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'idempotency key % was recorded by another request meanwhile', p_key
            USING ERRCODE = 'AP003';
    END IF;
    RETURN NEXT;
END
$$;
