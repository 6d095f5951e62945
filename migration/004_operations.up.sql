-- The key's life, visible in its row: how many attempts took it, when the
-- background sweep may try it next (NULL: as soon as it is takeable), and
-- (from migration 003) why the last attempt failed and whether the key is
-- parked for an operator.
ALTER TABLE /* TEMPLATE: schema */idempotency_keys
    ADD COLUMN attempts integer NOT NULL DEFAULT 1,
    ADD COLUMN next_attempt_at timestamptz;

-- The sweep's two queries: unfinished keys due for a try (those in backoff
-- sort last, so an outage's backlog costs the sweep nothing until it is
-- due), and finished keys past their retention. And the per-scope count of
-- unfinished keys, for Config.MaxUnfinishedPerScope.
CREATE INDEX idempotency_keys_due_idx ON /* TEMPLATE: schema */idempotency_keys (next_attempt_at NULLS FIRST)
    WHERE response_status IS NULL AND parked_at IS NULL;
CREATE INDEX idempotency_keys_unfinished_scope_idx ON /* TEMPLATE: schema */idempotency_keys (scope)
    WHERE response_status IS NULL AND parked_at IS NULL;
CREATE INDEX idempotency_keys_finished_at_idx ON /* TEMPLATE: schema */idempotency_keys (finished_at)
    WHERE response_status IS NOT NULL;

DROP FUNCTION /* TEMPLATE: schema */atomicphase_acquire(text, text, text, bytea, text, text, bytea, bigint, bigint);

-- atomicphase_acquire decides every case of an arriving request in one
-- statement and one round trip. A finished key (replay), another
-- fingerprint, or a live lock is answered by the primary-key read alone:
-- nothing is built, written or drawn. A new key, or an unfinished key that
-- is unlocked (parked or not) or whose lock is stale, goes through one
-- stale-lock-aware upsert that records it (or takes it over) under the
-- caller's lock token, counts the attempt, and returns where it stands. The
-- caller draws the token at random before the call, so it knows the token
-- even when the answer is lost and can unlock by it. The upsert re-checks
-- its WHERE against the newest row version, so of two attempts racing for a
-- key only one gets it; the loser reads the row again and reports what it
-- finds. When p_max_unfinished is set, a new key is refused (over_limit)
-- while its scope already has that many unfinished keys. The time is read
-- once into a variable: no volatile or stable function is evaluated per row.
CREATE FUNCTION /* TEMPLATE: schema */atomicphase_acquire(
    p_scope text, p_key text, p_workflow text, p_fingerprint bytea,
    p_method text, p_path text, p_state bytea, p_lock_timeout_us bigint,
    p_lock_token bigint, p_max_unfinished integer,
    OUT acquired boolean, OUT workflow text, OUT fingerprint bytea,
    OUT recovery_point text, OUT next_phase text, OUT state bytea,
    OUT lock_token bigint, OUT lock_expires_in float8, OUT downstream_salt uuid,
    OUT attempts integer, OUT took_over boolean, OUT over_limit boolean,
    OUT response_status integer, OUT response_header jsonb, OUT response_body bytea
) LANGUAGE plpgsql AS $$
DECLARE
    v_now        timestamptz := now();
    stale_before timestamptz := /* TEMPLATE: schema */atomicphase_stale_before(p_lock_timeout_us);
    held_since   timestamptz;
BEGIN
    acquired := false;
    took_over := false;
    over_limit := false;
    attempts := 0;
    FOR round IN 1..2 LOOP
        SELECT k.workflow, k.fingerprint, k.recovery_point, k.next_phase, k.lock_token,
               k.locked_at, k.attempts, k.response_status, k.response_header, k.response_body
        INTO workflow, fingerprint, recovery_point, next_phase, lock_token,
             held_since, attempts, response_status, response_header, response_body
        FROM /* TEMPLATE: schema */idempotency_keys k
        WHERE k.scope = p_scope AND k.idempotency_key = p_key;
        IF FOUND AND (response_status IS NOT NULL OR workflow <> p_workflow
                      OR fingerprint <> p_fingerprint
                      OR NOT /* TEMPLATE: schema */atomicphase_lock_takeable(held_since, stale_before)) THEN
            lock_expires_in := extract(epoch FROM held_since - stale_before)::float8;
            RETURN;
        END IF;
        took_over := FOUND AND held_since IS NOT NULL;
        IF NOT FOUND AND p_max_unfinished IS NOT NULL AND p_max_unfinished <= (
                SELECT count(*) FROM (
                    SELECT 1 FROM /* TEMPLATE: schema */idempotency_keys u
                    WHERE u.scope = p_scope AND u.response_status IS NULL AND u.parked_at IS NULL
                    LIMIT p_max_unfinished) AS capped) THEN
            over_limit := true;
            attempts := 0;
            workflow := p_workflow;
            fingerprint := p_fingerprint;
            recovery_point := 'started';
            lock_token := 0;
            RETURN;
        END IF;

        INSERT INTO /* TEMPLATE: schema */idempotency_keys AS k
            (scope, idempotency_key, workflow, fingerprint, request_method, request_path,
             state, lock_token, locked_at)
        VALUES (p_scope, p_key, p_workflow, p_fingerprint, p_method, p_path,
                p_state, p_lock_token, v_now)
        ON CONFLICT (scope, idempotency_key) DO UPDATE
            SET locked_at = v_now, lock_token = p_lock_token, updated_at = v_now,
                attempts = k.attempts + 1, parked_at = NULL, next_attempt_at = NULL
            WHERE k.response_status IS NULL AND k.workflow = p_workflow
              AND k.fingerprint = p_fingerprint
              AND /* TEMPLATE: schema */atomicphase_lock_takeable(k.locked_at, stale_before)
        RETURNING k.workflow, k.fingerprint, k.recovery_point, k.next_phase, k.state,
                  k.lock_token, k.downstream_salt, k.attempts
        INTO workflow, fingerprint, recovery_point, next_phase, state,
             lock_token, downstream_salt, attempts;
        IF FOUND THEN
            acquired := true;
            response_status := NULL;
            response_header := NULL;
            response_body := NULL;
            RETURN;
        END IF;
        -- Another attempt took the key between the read and the upsert.
        took_over := false;
    END LOOP;
    -- Contended twice in a row: report the key as held, with no expiry
    -- known, so the caller gets the default retry-after.
    workflow := p_workflow;
    fingerprint := p_fingerprint;
    recovery_point := 'started';
    lock_token := 0;
    attempts := 0;
    lock_expires_in := NULL;
END
$$;
