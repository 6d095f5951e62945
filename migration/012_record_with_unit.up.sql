-- The key row written once per commit (migration 012). A new key recorded
-- with its workflow's first transaction was inserted at the head of that
-- transaction (atomicphase_record) and updated by the checkpoint at its end:
-- two writes of one row, in one transaction. Now the head only claims the
-- key (atomicphase_claim: the advisory lock that makes a duplicate of a new
-- key answer 409 at once), and the commit inserts the row as the checkpoint
-- would have left it (atomicphase_record_unit). And atomicphase_lock_expires,
-- which every replay's read calls, is rewritten to be inlined (the same
-- result). Expand only: new functions; atomicphase_record, which a previous
-- release calls, is unchanged.

-- atomicphase_claim takes the transaction-scoped advisory lock a new key's
-- recording holds until its transaction ends (the lock atomicphase_record
-- and atomicphase_acquire take), or raises AP002 at once when another
-- transaction holds it (a duplicate of a new key in flight), or AP003 when
-- the key was recorded since the caller looked: either way the caller's
-- unit runs nothing, and the request goes on as an existing key's.
CREATE FUNCTION /* TEMPLATE: schema */atomicphase_claim(p_scope text, p_key text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtextextended(p_scope || chr(31) || p_key, 7)) THEN
        RAISE EXCEPTION 'idempotency key % is being recorded by another request', p_key
            USING ERRCODE = 'AP002';
    END IF;
    -- Every recording holds the lock until it commits: once it is ours, a
    -- key recorded before shows in this statement's snapshot.
    IF EXISTS (SELECT 1 FROM /* TEMPLATE: schema */idempotency_keys k
               WHERE k.scope = p_scope AND k.idempotency_key = p_key) THEN
        RAISE EXCEPTION 'idempotency key % was recorded by another request meanwhile', p_key
            USING ERRCODE = 'AP003';
    END IF;
END
$$;

-- atomicphase_record_unit records a new key, locked under the caller's
-- lock token, at the commit of its first transaction, with that
-- transaction's recovery point, jump target, state and (when the workflow
-- responded) response: the row atomicphase_record and
-- atomicphase_checkpoint would have left, in one INSERT. When the key
-- exists (recorded meanwhile, by a request that did not wait for the
-- claim) it raises AP003, and the transaction, whose COMMIT is queued
-- behind it, rolls back.
CREATE FUNCTION /* TEMPLATE: schema */atomicphase_record_unit(
    p_scope text, p_key text, p_workflow text, p_fingerprint bytea,
    p_method text, p_path text, p_lock_token bigint, p_lease_us bigint, p_version text,
    p_recovery_point text, p_next_phase text, p_state bytea,
    p_status integer, p_header jsonb, p_body bytea
) RETURNS TABLE (downstream_salt uuid) LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
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
    IF NOT FOUND THEN
        RAISE EXCEPTION 'idempotency key % was recorded by another request meanwhile', p_key
            USING ERRCODE = 'AP003';
    END IF;
    RETURN NEXT;
END
$$;

-- atomicphase_lock_expires, as in migration 007, written as one expression:
-- a SQL function whose body has a FROM clause is not inlined, and every
-- replay's read of its key paid for a function call. The same result.
CREATE OR REPLACE FUNCTION /* TEMPLATE: schema */atomicphase_lock_expires(
    p_locked_at timestamptz, p_lease_us bigint, p_call_until timestamptz, p_lock_timeout_us bigint,
    p_now timestamptz
) RETURNS timestamptz LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN p_locked_at + coalesce(p_lease_us, p_lock_timeout_us) * interval '1 microsecond' >= p_now
          OR p_call_until IS NULL
          OR p_call_until < p_locked_at + coalesce(p_lease_us, p_lock_timeout_us) * interval '1 microsecond'
        THEN p_locked_at + coalesce(p_lease_us, p_lock_timeout_us) * interval '1 microsecond'
        ELSE p_call_until END
$$;
