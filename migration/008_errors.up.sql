-- Errors end somewhere. A parked key is an answer, not a loop: a client's
-- retry of it is refused (with the parked key's "failed, waits for an
-- operator") instead of running its phases again; parked keys are bounded
-- (they count toward a scope's cap, and are reaped);  Only
-- functions and indexes are added: the functions a running previous
-- release calls are left as they were.

-- Parked keys are bounded: they count toward a scope's cap on unfinished
-- keys (Config.MaxUnfinishedPerScope), so a client whose requests keep
-- failing permanently runs into the cap instead of minting parked keys
-- without limit, and the sweep reaps them after a retention of their own.
-- (Their indexes are built by migration 010, concurrently.)

-- atomicphase_admit is atomicphase_acquire for a client's request, with
-- three more rules applied first. An unfinished key that is parked (and
-- unlocked), recorded for the same workflow and request, and parked before
-- it ran out of attempts (fewer than p_max_attempts: a permanent failure,
-- a bug) is not taken: parked is true and nothing is written. A key parked
-- because its attempts ran out is taken, as the sweep is not: parking stops
-- the sweep, not the client, whose retry may find the downstream back (a
-- parked key used with another request is left to atomicphase_acquire,
-- which reports the mismatch). A new key's scope counts its parked keys
-- toward p_max_unfinished, besides the unfinished keys atomicphase_acquire
-- counts, and the count and the insert are serialised per scope by a
-- transaction-scoped advisory lock on the scope, so that concurrent new
-- keys cannot all count the same keys and pass the cap together.
-- Everything else is atomicphase_acquire's, in the same statement and
-- round trip.
CREATE FUNCTION /* TEMPLATE: schema */atomicphase_admit(
    p_scope text, p_key text, p_workflow text, p_fingerprint bytea,
    p_method text, p_path text, p_state bytea, p_lock_timeout_us bigint,
    p_lock_token bigint, p_max_unfinished integer, p_max_attempts integer,
    OUT acquired boolean, OUT workflow text, OUT fingerprint bytea,
    OUT recovery_point text, OUT next_phase text, OUT state bytea,
    OUT lock_token bigint, OUT lock_expires_in float8, OUT downstream_salt uuid,
    OUT attempts integer, OUT took_over boolean, OUT over_limit boolean,
    OUT response_status integer, OUT response_header jsonb, OUT response_body bytea,
    OUT parked boolean
) LANGUAGE plpgsql AS $$
DECLARE
    v_max integer := p_max_unfinished;
BEGIN
    SELECT k.parked_at IS NOT NULL AND k.locked_at IS NULL AND k.response_status IS NULL
               AND k.workflow = p_workflow AND k.fingerprint = p_fingerprint
               AND (p_max_attempts IS NULL OR k.attempts < p_max_attempts),
           k.workflow, k.fingerprint, k.recovery_point, k.next_phase, k.attempts
    INTO parked, workflow, fingerprint, recovery_point, next_phase, attempts
    FROM /* TEMPLATE: schema */idempotency_keys k
    WHERE k.scope = p_scope AND k.idempotency_key = p_key;
    IF FOUND AND parked THEN
        acquired := false;
        took_over := false;
        over_limit := false;
        lock_token := 0;
        RETURN;
    END IF;
    IF NOT FOUND AND v_max IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(hashtextextended('atomicphase.scope_cap:' || p_scope, 0));
        v_max := greatest(0, v_max - (
            SELECT count(*) FROM (
                SELECT 1 FROM /* TEMPLATE: schema */idempotency_keys u
                WHERE u.scope = p_scope AND u.response_status IS NULL AND u.parked_at IS NOT NULL
                LIMIT v_max) AS capped))::integer;
    END IF;
    SELECT a.acquired, a.workflow, a.fingerprint, a.recovery_point, a.next_phase, a.state,
           a.lock_token, a.lock_expires_in, a.downstream_salt, a.attempts, a.took_over,
           a.over_limit, a.response_status, a.response_header, a.response_body, false
    INTO acquired, workflow, fingerprint, recovery_point, next_phase, state,
         lock_token, lock_expires_in, downstream_salt, attempts, took_over,
         over_limit, response_status, response_header, response_body, parked
    FROM /* TEMPLATE: schema */atomicphase_acquire(
        p_scope, p_key, p_workflow, p_fingerprint, p_method, p_path, p_state,
        p_lock_timeout_us, p_lock_token, v_max) AS a;
END
$$;
