-- Back to migration 011: a new key is inserted at the head of its first
-- transaction again.
DROP FUNCTION /* TEMPLATE: schema */atomicphase_record_unit(text, text, text, bytea, text, text, bigint, bigint, text, text, text, bytea, integer, jsonb, bytea);
DROP FUNCTION /* TEMPLATE: schema */atomicphase_claim(text, text);
CREATE OR REPLACE FUNCTION /* TEMPLATE: schema */atomicphase_lock_expires(
    p_locked_at timestamptz, p_lease_us bigint, p_call_until timestamptz, p_lock_timeout_us bigint,
    p_now timestamptz
) RETURNS timestamptz LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN lease_end >= p_now OR p_call_until IS NULL OR p_call_until < lease_end THEN lease_end
        ELSE p_call_until END
    FROM (SELECT p_locked_at + coalesce(p_lease_us, p_lock_timeout_us) * interval '1 microsecond' AS lease_end) AS l
$$;
