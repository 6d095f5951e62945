-- atomicphase_record_first as in migration 020, looking for the key
-- before it takes a transaction id. A request whose key exists and whose
-- batch records it at its head (WorkflowOpts.AssumeNewKeys: a replay, a
-- retry) is refused there (AP003), as before, but no longer takes an id
-- first: its transaction, aborted, writes no WAL record and adds nothing
-- for VACUUM's freezing. The look costs a new key nothing measurable (the
-- INSERT's own conflict check reads the same index page). Expand only:
-- the same signature and answers, so a previous release calls it
-- unchanged. The id is still taken before the key's times are read: a
-- sweep that plans its watermark after created_at was read waits for
-- this transaction.
CREATE OR REPLACE FUNCTION /* TEMPLATE: schema */atomicphase_record_first(
    p_scope text, p_key text, p_workflow text, p_fingerprint bytea,
    p_method text, p_path text, p_lock_token bigint, p_lease_us bigint, p_version text,
    p_recovery_point text, p_next_phase text, p_state bytea,
    p_status integer, p_header jsonb, p_body bytea
) RETURNS TABLE (downstream_salt uuid) LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz;
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtextextended(p_scope || chr(31) || p_key, 7)) THEN
        RAISE EXCEPTION 'idempotency key % is being recorded by another request', p_key
            USING ERRCODE = 'AP002';
    END IF;
    -- A new snapshot (the function is volatile): a key committed before
    -- the lock was taken is seen.
    IF EXISTS (SELECT FROM /* TEMPLATE: schema */idempotency_keys k
               WHERE k.scope = p_scope AND k.idempotency_key = p_key) THEN
        RAISE EXCEPTION 'idempotency key % was recorded by another request meanwhile', p_key
            USING ERRCODE = 'AP003';
    END IF;
    PERFORM txid_current();
    v_now := clock_timestamp();
    INSERT INTO /* TEMPLATE: schema */idempotency_keys AS k
        (scope, idempotency_key, workflow, fingerprint, request_method, request_path,
         state, lock_token, locked_at, created_at, updated_at, lease_us, workflow_version,
         recovery_point, next_phase, response_status, response_header, response_body, finished_at)
    VALUES (p_scope, p_key, p_workflow, p_fingerprint, p_method, p_path,
            p_state, p_lock_token, CASE WHEN p_status IS NULL THEN v_now END, v_now, v_now, p_lease_us, p_version,
            p_recovery_point, p_next_phase, p_status, p_header, p_body,
            CASE WHEN p_status IS NOT NULL THEN v_now END)
    ON CONFLICT (scope, idempotency_key) DO NOTHING
    RETURNING k.downstream_salt INTO downstream_salt;
    -- A key recorded since the look, by a request that does not take the
    -- claim's lock (atomicphase_acquire).
    IF NOT FOUND THEN
        RAISE EXCEPTION 'idempotency key % was recorded by another request meanwhile', p_key
            USING ERRCODE = 'AP003';
    END IF;
    RETURN NEXT;
END
$$;
