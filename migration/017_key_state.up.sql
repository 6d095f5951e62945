-- Each key's state, stored (status), the one truth every reader and every
-- writer goes by, and a key's history. Expand only: a column, a table and
-- the functions rewritten under their names, so that the previous
-- release, which writes keys only through them, keeps every key's status
-- true while this one rolls out.
--
-- status is one of:
--   r  running: an attempt holds the key (its lease, locked_at and
--      lease_us, running or run out: a reader calls it stale);
--   w  waiting: nobody holds it; a retry or the sweep resumes it;
--   u  unknown: nobody holds it, and a foreign call's outcome is unknown;
--   p  parked: a permanent failure, or its attempts spent;
--   f  finished: its response is stored, and final.
-- Time changes none: a running key whose lease ran out and a waiting key
-- in a foreign call's quiet period are what a reader makes of the status
-- and the lease, never a write. Every statement that moves a key sets it,
-- and names in its WHERE the states key_state.go's table lets that
-- operation move a key from (TestKeyStateTableIsTheDatabases). The other
-- columns of a state are its data: locked_at and lease_us a running key's
-- lease, parked_at (and final_parked_at) a parked key's, unknown_at an
-- unknown outcome's, response_* a finished key's answer.
--
-- Every existing key is finished but for the few that are not: the column
-- is added with 'f' for all at once (PostgreSQL stores the default, it
-- writes no row), then those are set to what their columns say, and the
-- default goes, so that a writer that does not say a key's state fails.
-- On Citus, the key table may be distributed already: its multi-shard
-- commands run in order (as Migrate has them run), for the functions after
-- them to be created (a setting of no effect elsewhere).
SET LOCAL citus.multi_shard_modify_mode TO 'sequential';
ALTER TABLE /* TEMPLATE: schema */idempotency_keys ADD COLUMN status "char" NOT NULL DEFAULT 'f';
UPDATE /* TEMPLATE: schema */idempotency_keys
SET status = CASE WHEN parked_at IS NOT NULL THEN 'p'
                  WHEN locked_at IS NOT NULL THEN 'r'
                  WHEN unknown_at IS NOT NULL THEN 'u'
                  ELSE 'w' END
WHERE response_status IS NULL;
ALTER TABLE /* TEMPLATE: schema */idempotency_keys ALTER COLUMN status DROP DEFAULT;

-- A key's history: what went wrong with it, one row per event, written by
-- the functions below only when something does (an attempt that failed,
-- or left an outcome unknown, or parked the key; a take of a key that went
-- wrong, or of one whose holder's lease ran out; an unpark, a verdict; the
-- finish of a key that went wrong). A request that succeeds first time
-- writes none. Operators' actions, with who took them, are in
-- atomicphase_audit. Deleted with its key.
CREATE TABLE /* TEMPLATE: schema */atomicphase_key_history (
    scope           text        NOT NULL,
    idempotency_key text        NOT NULL,
    id              bigint      GENERATED ALWAYS AS IDENTITY,
    at              timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- failed, unknown, parked, resumed, taken_over, unparked, resolved,
    -- settled, finished
    event           text        NOT NULL,
    status_before   text        NOT NULL,
    status          text        NOT NULL,
    recovery_point  text        NOT NULL,
    -- The key's attempts, and the lock token of the attempt the event is
    -- of (the one that failed, the one that took the key).
    attempt         integer     NOT NULL,
    lock_token      bigint      NOT NULL,
    -- Why the attempt failed (the key's last_error), for a failure.
    error           text,
    PRIMARY KEY (scope, idempotency_key, id)
);

-- On Citus, a key table already distributed takes its history beside it,
-- on the same shards. (A new install's is distributed with the key table,
-- CitusDistribution.) Every operator named with its schema, every
-- comparison between values of one type: nothing a role planted on the
-- path stands in for them (docs/security-and-limits.md, "Database roles").
DO $$
DECLARE
    v_keys    regclass := (SELECT t.typrelid FROM pg_catalog.pg_type t
                           WHERE t.oid OPERATOR(pg_catalog.=) pg_catalog.pg_typeof(NULL::/* TEMPLATE: schema */idempotency_keys)::pg_catalog.oid);
    v_history regclass := (SELECT t.typrelid FROM pg_catalog.pg_type t
                           WHERE t.oid OPERATOR(pg_catalog.=) pg_catalog.pg_typeof(NULL::/* TEMPLATE: schema */atomicphase_key_history)::pg_catalog.oid);
    v_grantee text;
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'citus'::pg_catalog.name) THEN
        IF EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid OPERATOR(pg_catalog.=) v_keys) THEN
            PERFORM create_distributed_table(v_history, 'scope', colocate_with := v_keys::text);
        END IF;
    END IF;
    -- Each role granted UPDATE or DELETE on the key table (PUBLIC too,
    -- where it is) gets SELECT, INSERT, UPDATE and DELETE on the history,
    -- which the functions below write as the role that calls them (a
    -- previous release, running as such a role while this one rolls out,
    -- thus keeps working). A role granted the key table later needs them
    -- too (docs/security-and-limits.md, "Database roles").
    FOR v_grantee IN
        SELECT DISTINCT CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0::pg_catalog.oid THEN 'PUBLIC'
                             ELSE pg_catalog.quote_ident(r.rolname::pg_catalog.text) END
        FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
        LEFT JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) a.grantee
        WHERE c.oid OPERATOR(pg_catalog.=) v_keys::pg_catalog.oid
          AND a.privilege_type OPERATOR(pg_catalog.=) ANY ('{UPDATE,DELETE}'::pg_catalog.text[])
          AND a.grantee OPERATOR(pg_catalog.<>) c.relowner
    LOOP
        EXECUTE pg_catalog.format('GRANT SELECT, INSERT, UPDATE, DELETE ON %s TO %s', v_history, v_grantee);
    END LOOP;
END
$$;

-- atomicphase_refuse raises code with message, and returns nothing: the
-- one function a plain statement of the library's calls, and only on the
-- branch that refuses (a key found that was to be recorded, a claim taken
-- by another transaction, a checkpoint that lost its lock), so that the
-- statement ends its batch there. A request that succeeds runs none.
CREATE FUNCTION /* TEMPLATE: schema */atomicphase_refuse(p_code text, p_message text)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = p_code, MESSAGE = p_message;
END
$$;

-- atomicphase_state_name is a state's name in the history and the
-- console: running, waiting, unknown, parked, finished.
CREATE FUNCTION /* TEMPLATE: schema */atomicphase_state_name(p_status "char")
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    -- A searched CASE: Citus deparses a simple one (CASE p_status WHEN …),
    -- inlined into a statement it sends a worker, into a comparison of
    -- "char" with boolean, which fails there.
    SELECT CASE WHEN p_status = 'r' THEN 'running' WHEN p_status = 'w' THEN 'waiting'
                WHEN p_status = 'u' THEN 'unknown' WHEN p_status = 'p' THEN 'parked'
                WHEN p_status = 'f' THEN 'finished' END
$$;

-- atomicphase_key_event writes an event of a key's history, when the key
-- moved off the happy path or along it after: p_event names it, or, when
-- NULL, it is named by the change (from p_from to p_to): a running key
-- left waiting failed; one left unknown or parked is so; a key taken is
-- resumed (or taken over, from a holder whose lease ran out: named by the
-- caller); a parked key made waiting or unknown is unparked; an unknown
-- outcome settled with no attempt holding the key is settled. A key keeps
-- its newest 1000 events; a finished key none of its error texts (they
-- may quote what the client sent, as last_error may).
CREATE FUNCTION /* TEMPLATE: schema */atomicphase_key_event(
    p_scope text, p_key text, p_event text, p_from "char", p_to "char",
    p_recovery_point text, p_attempt integer, p_lock_token bigint, p_error text
) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_event text := coalesce(p_event, CASE
        WHEN p_from = 'r' AND p_to = 'w' THEN 'failed'
        WHEN p_from = 'r' THEN /* TEMPLATE: schema */atomicphase_state_name(p_to)
        WHEN p_to = 'r' THEN 'resumed'
        WHEN p_from = 'p' THEN 'unparked'
        WHEN p_to = 'p' OR p_to = 'u' THEN /* TEMPLATE: schema */atomicphase_state_name(p_to)
        ELSE 'settled' END);
BEGIN
    INSERT INTO /* TEMPLATE: schema */atomicphase_key_history
        (scope, idempotency_key, event, status_before, status, recovery_point, attempt, lock_token, error)
    VALUES (p_scope, p_key, v_event, /* TEMPLATE: schema */atomicphase_state_name(p_from),
            /* TEMPLATE: schema */atomicphase_state_name(p_to), p_recovery_point, p_attempt, p_lock_token, p_error);
    IF p_to = 'f' THEN
        UPDATE /* TEMPLATE: schema */atomicphase_key_history h SET error = NULL
        WHERE h.scope = p_scope AND h.idempotency_key = p_key AND h.error IS NOT NULL;
    ELSE
        -- (In time order: on Citus an event's id depends on the node its
        -- shard is on.)
        DELETE FROM /* TEMPLATE: schema */atomicphase_key_history h
        WHERE h.scope = p_scope AND h.idempotency_key = p_key
          AND (h.at, h.id) <= (SELECT o.at, o.id FROM /* TEMPLATE: schema */atomicphase_key_history o
                               WHERE o.scope = p_scope AND o.idempotency_key = p_key
                               ORDER BY o.at DESC, o.id DESC OFFSET 1000 LIMIT 1);
    END IF;
END
$$;

-- The functions below are those a release calls to write a key, each
-- under the name and arguments it had (a previous release calls them),
-- each now writing the key's status, and its history when the key leaves
-- the happy path. Each write names, in a comment on its status test, the
-- operation of key_state.go's table whose from-states it lists
-- (TestKeyStateTableIsTheDatabases reads them). Each compares values of
-- one type only, so that nothing planted on the search path stands in for
-- a built-in (docs/security-and-limits.md, "Database roles").

-- atomicphase_acquire as in migration 016, the key's state stored: a new
-- key is recorded running; a key nobody holds (waiting, unknown, parked
-- after its attempts, or running with its lease run out) is taken, and the
-- take goes in its history. A key whose reconciliation is backing off
-- (unknown, tried since it became so: updated_at after unknown_at, and
-- resting until next_attempt_at) is held until then, as a live attempt's
-- is: a client's retry is refused, told when to come back, and counts no
-- attempt. A refusal of a key no live lease holds (only such a backoff,
-- or a foreign call's quiet period) sets took_over, which means nothing
-- else on a refusal (a previous release reads it only when it acquired):
-- nothing changes before lock_expires_in, which is when to retry.
CREATE OR REPLACE FUNCTION /* TEMPLATE: schema */atomicphase_acquire(
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
    v_now      timestamptz := now();
    held_since timestamptz;
    v_until    timestamptz;
    v_expires  timestamptz;
    v_backoff  timestamptz;
    v_lease    bigint;
    v_status   "char";
BEGIN
    acquired := false;
    took_over := false;
    over_limit := false;
    attempts := 0;
    FOR round IN 1..2 LOOP
        SELECT k.workflow, k.fingerprint, k.recovery_point, k.next_phase, k.lock_token,
               k.locked_at, /* TEMPLATE: schema */atomicphase_held_until(k.locked_at, k.lease_us, k.call_until, p_lock_timeout_us),
               /* TEMPLATE: schema */atomicphase_lock_expires(k.locked_at, k.lease_us, k.call_until, p_lock_timeout_us, v_now),
               k.attempts, k.response_status, k.response_header, k.response_body,
               CASE WHEN k.status = 'u' AND k.updated_at > k.unknown_at THEN k.next_attempt_at END,
               coalesce(k.lease_us, p_lock_timeout_us), k.status
        INTO workflow, fingerprint, recovery_point, next_phase, lock_token,
             held_since, v_until, v_expires, attempts, response_status, response_header, response_body,
             v_backoff, v_lease, v_status
        FROM /* TEMPLATE: schema */idempotency_keys k
        WHERE k.scope = p_scope AND k.idempotency_key = p_key;
        IF FOUND AND v_backoff > v_now AND v_backoff > coalesce(v_until, '-infinity') THEN
            -- Held by its reconciliation's backoff (above).
            v_until := v_backoff;
            v_expires := v_backoff;
        END IF;
        IF FOUND AND (v_status = 'f' OR workflow <> p_workflow
                      OR fingerprint <> p_fingerprint OR v_until >= v_now) THEN
            lock_expires_in := extract(epoch FROM v_expires - v_now)::float8;
            -- No live lease holds it (above).
            took_over := v_status <> 'f' AND v_until >= v_now
                         AND NOT coalesce(v_now - held_since <= v_lease::float8 * interval '1 microsecond', false);
            RETURN;
        END IF;
        took_over := FOUND AND v_status = 'r';
        IF NOT FOUND AND NOT pg_try_advisory_xact_lock(hashtextextended(p_scope || chr(31) || p_key, 7::bigint)) THEN
            EXIT; -- being recorded by another transaction: held
        END IF;
        IF NOT FOUND AND p_max_unfinished IS NOT NULL AND p_max_unfinished::bigint <= (
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
             state, lock_token, locked_at, lease_us, status)
        VALUES (p_scope, p_key, p_workflow, p_fingerprint, p_method, p_path,
                p_state, p_lock_token, v_now, p_lock_timeout_us, 'r')
        ON CONFLICT (scope, idempotency_key) DO UPDATE
            SET locked_at = v_now, lock_token = p_lock_token, updated_at = v_now,
                attempts = k.attempts + 1, parked_at = NULL, next_attempt_at = v_now,
                lease_us = p_lock_timeout_us, status = 'r'
            WHERE k.status = ANY ('{r,w,u,p}'::"char"[]) /* from: run */ AND k.workflow = p_workflow
              AND (k.final_parked_at IS NULL OR k.final_parked_at IS DISTINCT FROM k.parked_at)
              AND k.fingerprint = p_fingerprint
              AND (k.status <> 'r' OR v_now - k.locked_at > coalesce(k.lease_us, p_lock_timeout_us)::float8 * interval '1 microsecond')
              AND (k.call_until IS NULL OR k.call_until < v_now)
              AND NOT (k.status = 'u' AND k.updated_at > k.unknown_at
                       AND k.next_attempt_at IS NOT NULL AND k.next_attempt_at > v_now)
        RETURNING k.workflow, k.fingerprint, k.recovery_point, k.next_phase, k.state,
                  k.lock_token, k.downstream_salt, k.attempts
        INTO workflow, fingerprint, recovery_point, next_phase, state,
             lock_token, downstream_salt, attempts;
        IF FOUND THEN
            acquired := true;
            response_status := NULL;
            response_header := NULL;
            response_body := NULL;
            IF attempts > 1 THEN
                -- A take, not a new key's recording.
                PERFORM /* TEMPLATE: schema */atomicphase_key_event(p_scope, p_key,
                    CASE WHEN took_over THEN 'taken_over' END, coalesce(v_status, 'w'), 'r',
                    recovery_point, attempts, p_lock_token, NULL);
            END IF;
            RETURN;
        END IF;
        -- Another attempt took the key between the read and the upsert.
        took_over := false;
    END LOOP;
    -- Contended, or being recorded: report the key as held, with no expiry
    -- known, so the caller gets the default retry-after.
    workflow := p_workflow;
    fingerprint := p_fingerprint;
    recovery_point := 'started';
    lock_token := 0;
    attempts := 0;
    lock_expires_in := NULL;
    took_over := false;
END
$$;

-- atomicphase_admit as in migration 008, a parked key told by its status.
CREATE OR REPLACE FUNCTION /* TEMPLATE: schema */atomicphase_admit(
    p_scope text, p_key text, p_workflow text, p_fingerprint bytea,
    p_method text, p_path text, p_state bytea, p_lock_timeout_us bigint,
    p_lock_token bigint, p_max_unfinished integer,
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
    SELECT k.status = 'p' AND k.workflow = p_workflow AND k.fingerprint = p_fingerprint
               AND k.final_parked_at = k.parked_at,
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
        PERFORM pg_advisory_xact_lock(hashtextextended('atomicphase.scope_cap:' || p_scope, 0::bigint));
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

-- atomicphase_take as in migration 016 (Resume, the sweep, a verdict's
-- resolution), the key's state stored and the take in its history.
CREATE OR REPLACE FUNCTION /* TEMPLATE: schema */atomicphase_take(
    p_scope text, p_key text, p_lock_timeout_us bigint, p_lock_token bigint, p_sweep boolean
) RETURNS TABLE (
    workflow text, recovery_point text, next_phase text, state bytea,
    lock_token bigint, downstream_salt uuid, attempts integer, took_over boolean
) LANGUAGE plpgsql AS $$
DECLARE
    v_now    timestamptz := now();
    v_before "char";
BEGIN
    UPDATE /* TEMPLATE: schema */idempotency_keys AS k
    SET locked_at = v_now, lock_token = p_lock_token, updated_at = v_now, parked_at = NULL,
        next_attempt_at = v_now, attempts = k.attempts + 1, lease_us = p_lock_timeout_us, status = 'r'
    FROM (SELECT b.status FROM /* TEMPLATE: schema */idempotency_keys b
          WHERE b.scope = p_scope AND b.idempotency_key = p_key) AS before
    WHERE k.scope = p_scope AND k.idempotency_key = p_key
      AND k.status = ANY (CASE WHEN p_sweep THEN '{r,w,u}'::"char"[] /* from: sweep */
                               ELSE '{r,w,u,p}'::"char"[] /* from: resume */ END)
      AND (k.status <> 'r' OR v_now - k.locked_at > coalesce(k.lease_us, p_lock_timeout_us)::float8 * interval '1 microsecond')
      AND (k.call_until IS NULL OR k.call_until < v_now)
      AND (p_sweep IS NOT TRUE OR k.next_attempt_at IS NULL OR k.next_attempt_at <= v_now)
    RETURNING k.workflow, k.recovery_point, k.next_phase, k.state, k.lock_token,
              k.downstream_salt, k.attempts, before.status = 'r', before.status
    INTO workflow, recovery_point, next_phase, state, lock_token,
         downstream_salt, attempts, took_over, v_before;
    IF FOUND THEN
        PERFORM /* TEMPLATE: schema */atomicphase_key_event(p_scope, p_key,
            CASE WHEN took_over THEN 'taken_over' END, v_before, 'r',
            recovery_point, attempts, p_lock_token, NULL);
        RETURN NEXT;
    END IF;
END
$$;

-- atomicphase_release, in its three forms, as in migration 015: the key
-- nobody holds now, waiting, unknown (its outcome unknown, now or still)
-- or parked, and the failure in its history.
CREATE OR REPLACE FUNCTION /* TEMPLATE: schema */atomicphase_release(
    p_scope text, p_key text, p_lock_token bigint,
    p_error text, p_retry_in_us bigint, p_park boolean, p_unknown boolean, p_final boolean,
    p_called boolean
) RETURNS SETOF boolean LANGUAGE plpgsql AS $$
DECLARE
    v_now    timestamptz := now();
    v_next   timestamptz := v_now + p_retry_in_us::float8 * interval '1 microsecond';
    v_before "char";
    v_after  "char";
    v_point  text;
    v_tries  integer;
BEGIN
    UPDATE /* TEMPLATE: schema */idempotency_keys AS k SET
        locked_at = NULL,
        updated_at = v_now,
        last_error = coalesce(p_error, k.last_error),
        next_attempt_at = CASE WHEN p_retry_in_us IS NULL THEN k.next_attempt_at ELSE v_next END,
        parked_at = CASE WHEN p_park THEN v_now ELSE k.parked_at END,
        final_parked_at = CASE WHEN p_park AND p_final THEN v_now ELSE k.final_parked_at END,
        unknown_at = CASE WHEN p_unknown THEN coalesce(k.unknown_at, v_now) ELSE k.unknown_at END,
        called_at = CASE WHEN p_called THEN coalesce(k.called_at, v_now) ELSE k.called_at END,
        status = CASE WHEN p_park OR k.status = 'p' THEN 'p'
                      WHEN p_unknown OR k.unknown_at IS NOT NULL THEN 'u' ELSE 'w' END
    FROM (SELECT b.status FROM /* TEMPLATE: schema */idempotency_keys b
          WHERE b.scope = p_scope AND b.idempotency_key = p_key) AS before
    WHERE k.scope = p_scope AND k.idempotency_key = p_key AND k.lock_token = p_lock_token
      AND k.status = ANY ('{r,w,u,p}'::"char"[]) /* from: run */
    RETURNING before.status, k.status, k.recovery_point, k.attempts INTO v_before, v_after, v_point, v_tries;
    IF FOUND THEN
        IF v_before <> v_after THEN
            PERFORM /* TEMPLATE: schema */atomicphase_key_event(p_scope, p_key, NULL, v_before, v_after,
                v_point, v_tries, p_lock_token, CASE WHEN v_before = 'r' THEN p_error END);
        END IF;
        RETURN NEXT true;
    END IF;
END
$$;
CREATE OR REPLACE FUNCTION /* TEMPLATE: schema */atomicphase_release(
    p_scope text, p_key text, p_lock_token bigint,
    p_error text, p_retry_in_us bigint, p_park boolean, p_unknown boolean
) RETURNS SETOF boolean LANGUAGE sql AS $$
    SELECT r FROM /* TEMPLATE: schema */atomicphase_release(
        p_scope, p_key, p_lock_token, p_error, p_retry_in_us, p_park, p_unknown, false, p_park) AS r
$$;
CREATE OR REPLACE FUNCTION /* TEMPLATE: schema */atomicphase_release(
    p_scope text, p_key text, p_lock_token bigint,
    p_error text, p_retry_in_us bigint, p_park boolean, p_unknown boolean, p_final boolean
) RETURNS SETOF boolean LANGUAGE sql AS $$
    SELECT r FROM /* TEMPLATE: schema */atomicphase_release(
        p_scope, p_key, p_lock_token, p_error, p_retry_in_us, p_park, p_unknown, p_final, p_park) AS r
$$;

-- atomicphase_renew as in migration 007: a running key's lease renewed,
-- and its call marked.
CREATE OR REPLACE FUNCTION /* TEMPLATE: schema */atomicphase_renew(
    p_scope text, p_key text, p_lock_token bigint, p_lease_us bigint, p_call_us bigint
) RETURNS SETOF boolean LANGUAGE plpgsql AS $$
DECLARE
    v_now  timestamptz := now();
    v_call timestamptz := v_now + p_call_us::float8 * interval '1 microsecond';
BEGIN
    UPDATE /* TEMPLATE: schema */idempotency_keys AS k
    SET locked_at = v_now, lease_us = p_lease_us,
        call_until = CASE WHEN p_call_us IS NULL THEN k.call_until ELSE v_call END
    WHERE k.scope = p_scope AND k.idempotency_key = p_key AND k.lock_token = p_lock_token
      AND k.status = 'r' /* from: run */;
    IF FOUND THEN
        RETURN NEXT true;
    END IF;
END
$$;

-- atomicphase_checkpoint as in migration 016 (a previous release's, and
-- this one's on Citus): a running key's recovery point, finished with the
-- response; the finish of a key that went wrong in its history.
CREATE OR REPLACE FUNCTION /* TEMPLATE: schema */atomicphase_checkpoint(
    p_scope text, p_key text, p_lock_token bigint,
    p_recovery_point text, p_next_phase text, p_state bytea,
    p_status integer, p_header jsonb, p_body bytea
) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_now   timestamptz := clock_timestamp();
    v_tries integer;
    v_mark  boolean;
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
        next_attempt_at = CASE WHEN p_status IS NULL THEN next_attempt_at END,
        call_until      = NULL,
        updated_at      = v_now,
        status          = CASE WHEN p_status IS NULL THEN 'r' ELSE 'f' END
    WHERE scope = p_scope
      AND idempotency_key = p_key
      AND lock_token = p_lock_token
      AND status = 'r' /* from: run */
    RETURNING attempts, resolved_at IS NOT NULL INTO v_tries, v_mark;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'idempotency key % lost its lock to a newer attempt', p_key
            USING ERRCODE = 'AP001';
    END IF;
    IF p_status IS NOT NULL AND (v_tries > 1 OR v_mark) THEN
        PERFORM /* TEMPLATE: schema */atomicphase_key_event(p_scope, p_key, 'finished', 'r', 'f',
            p_recovery_point, v_tries, p_lock_token, NULL);
    END IF;
END
$$;

-- atomicphase_record as in migration 007 (the previous release's
-- recording, through its form of migration 011): a new key, running.
CREATE OR REPLACE FUNCTION /* TEMPLATE: schema */atomicphase_record(
    p_scope text, p_key text, p_workflow text, p_fingerprint bytea,
    p_method text, p_path text, p_state bytea, p_lock_token bigint,
    p_max_unfinished integer, p_lease_us bigint
) RETURNS TABLE (downstream_salt uuid) LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := now();
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtextextended(p_scope || chr(31) || p_key, 7::bigint)) THEN
        RAISE EXCEPTION 'idempotency key % is being recorded by another request', p_key
            USING ERRCODE = 'AP002';
    END IF;
    IF p_max_unfinished IS NOT NULL AND p_max_unfinished::bigint <= (
            SELECT count(*) FROM (
                SELECT 1 FROM /* TEMPLATE: schema */idempotency_keys u
                WHERE u.scope = p_scope AND u.response_status IS NULL AND u.parked_at IS NULL
                LIMIT p_max_unfinished) AS capped) THEN
        RETURN;
    END IF;
    INSERT INTO /* TEMPLATE: schema */idempotency_keys AS k
        (scope, idempotency_key, workflow, fingerprint, request_method, request_path,
         state, lock_token, locked_at, created_at, updated_at, lease_us, status)
    VALUES (p_scope, p_key, p_workflow, p_fingerprint, p_method, p_path,
            p_state, p_lock_token, v_now, v_now, v_now, p_lease_us, 'r')
    ON CONFLICT (scope, idempotency_key) DO NOTHING
    RETURNING k.downstream_salt INTO downstream_salt;
    IF FOUND THEN
        RETURN NEXT;
    END IF;
END
$$;

-- atomicphase_record_unit as in migration 012 (a previous release's
-- recording at its first unit's commit): a new key, running, or finished
-- when the unit responds.
CREATE OR REPLACE FUNCTION /* TEMPLATE: schema */atomicphase_record_unit(
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

-- atomicphase_unpark as in migration 016 (a previous release's Unpark,
-- which takes any unfinished key): a parked key made waiting (or unknown,
-- its outcome still so), its unpark in its history; another's backoff
-- cleared.
CREATE OR REPLACE FUNCTION /* TEMPLATE: schema */atomicphase_unpark(p_scope text, p_key text)
RETURNS SETOF boolean LANGUAGE plpgsql AS $$
DECLARE
    v_now    timestamptz := now();
    v_before "char";
    v_after  "char";
    v_point  text;
    v_token  bigint;
BEGIN
    UPDATE /* TEMPLATE: schema */idempotency_keys AS k
    SET parked_at = NULL, next_attempt_at = v_now, updated_at = v_now, attempts = 1,
        status = CASE WHEN k.status <> 'p' THEN k.status WHEN k.unknown_at IS NOT NULL THEN 'u' ELSE 'w' END
    FROM (SELECT b.status FROM /* TEMPLATE: schema */idempotency_keys b
          WHERE b.scope = p_scope AND b.idempotency_key = p_key) AS before
    WHERE k.scope = p_scope AND k.idempotency_key = p_key
      AND (k.status = 'p' /* from: unpark */ OR k.status = ANY ('{r,w,u}'::"char"[]) /* from: due */)
    RETURNING before.status, k.status, k.recovery_point, k.lock_token INTO v_before, v_after, v_point, v_token;
    IF FOUND THEN
        IF v_before = 'p' THEN
            PERFORM /* TEMPLATE: schema */atomicphase_key_event(p_scope, p_key, 'unparked', v_before, v_after,
                v_point, 1, v_token, NULL);
        END IF;
        RETURN NEXT true;
    END IF;
END
$$;

-- atomicphase_schedule makes an unfinished key due at once, marked as
-- atomicphase_unpark marks it, for this release's Unpark and MakeDue:
-- with p_unpark, a parked key only, unparked with a fresh budget of
-- attempts (and its unpark in its history); without, a key that is not
-- parked, its backoff cleared and its attempts as they are. It returns
-- true when it changed the key, and nothing for any other.
CREATE FUNCTION /* TEMPLATE: schema */atomicphase_schedule(p_scope text, p_key text, p_unpark boolean)
RETURNS SETOF boolean LANGUAGE plpgsql AS $$
DECLARE
    v_now   timestamptz := now();
    v_after "char";
    v_point text;
    v_token bigint;
BEGIN
    UPDATE /* TEMPLATE: schema */idempotency_keys AS k
    SET parked_at = NULL, next_attempt_at = v_now, updated_at = v_now,
        attempts = CASE WHEN p_unpark THEN 1 ELSE k.attempts END,
        status = CASE WHEN NOT p_unpark THEN k.status WHEN k.unknown_at IS NOT NULL THEN 'u' ELSE 'w' END
    WHERE k.scope = p_scope AND k.idempotency_key = p_key
      AND k.status = ANY (CASE WHEN p_unpark THEN '{p}'::"char"[] /* from: unpark */
                               ELSE '{r,w,u}'::"char"[] /* from: due */ END)
    RETURNING k.status, k.recovery_point, k.lock_token INTO v_after, v_point, v_token;
    IF FOUND THEN
        IF p_unpark THEN
            PERFORM /* TEMPLATE: schema */atomicphase_key_event(p_scope, p_key, 'unparked', 'p', v_after,
                v_point, 1, v_token, NULL);
        END IF;
        RETURN NEXT true;
    END IF;
END
$$;

-- atomicphase_record_verdict and atomicphase_record_resolution as in
-- migration 016: an operator's verdict on an unknown outcome, which makes
-- the key due (waiting for its attempt to take the verdict; running while
-- a stale holder keeps it) with a fresh budget of attempts, but for a key
-- parked for good (a permanent failure, a panic: a bug in its code): the
-- verdict settles its call's outcome, and the key stays parked, with its
-- attempts, until an operator unparks it; the attempt that resumes it
-- then takes the verdict. The verdict goes in the key's history.
CREATE OR REPLACE FUNCTION /* TEMPLATE: schema */atomicphase_record_verdict(
    p_scope text, p_key text, p_happened boolean, p_note text, p_lock_timeout_us bigint, p_result jsonb
) RETURNS TABLE (workflow text, recorded boolean) LANGUAGE plpgsql AS $$
DECLARE
    v_now    timestamptz := now();
    v_before "char";
    v_after  "char";
    v_point  text;
    v_tries  integer;
    v_token  bigint;
BEGIN
    UPDATE /* TEMPLATE: schema */idempotency_keys AS k
    SET resolved_after = k.recovery_point, resolved_happened = p_happened, resolved_note = p_note,
        resolved_result = p_result, resolved_at = v_now,
        parked_at = CASE WHEN k.final_parked_at = k.parked_at THEN k.parked_at END,
        next_attempt_at = CASE WHEN k.final_parked_at = k.parked_at THEN k.next_attempt_at ELSE v_now END,
        updated_at = v_now, attempts = CASE WHEN k.final_parked_at = k.parked_at THEN k.attempts ELSE 1 END,
        status = CASE WHEN k.status = 'p' AND k.final_parked_at = k.parked_at THEN 'p'
                      WHEN k.status = 'r' THEN 'r' ELSE 'u' END
    FROM (SELECT b.status FROM /* TEMPLATE: schema */idempotency_keys b
          WHERE b.scope = p_scope AND b.idempotency_key = p_key) AS before
    WHERE k.scope = p_scope AND k.idempotency_key = p_key
      AND k.status = ANY ('{r,u,p}'::"char"[]) /* from: verdict */
      AND k.unknown_at IS NOT NULL
      AND (k.status <> 'r' OR v_now - k.locked_at > coalesce(k.lease_us, p_lock_timeout_us)::float8 * interval '1 microsecond')
      AND (k.call_until IS NULL OR k.call_until < v_now)
    RETURNING k.workflow, before.status, k.status, k.recovery_point, k.attempts, k.lock_token
    INTO workflow, v_before, v_after, v_point, v_tries, v_token;
    IF FOUND THEN
        PERFORM /* TEMPLATE: schema */atomicphase_key_event(p_scope, p_key, 'resolved', v_before, v_after,
            v_point, v_tries, v_token, NULL);
        recorded := true;
        RETURN NEXT;
        RETURN;
    END IF;
    SELECT k.workflow, false INTO workflow, recorded
    FROM /* TEMPLATE: schema */idempotency_keys k
    WHERE k.scope = p_scope AND k.idempotency_key = p_key AND k.status <> 'f'
      AND coalesce(/* TEMPLATE: schema */atomicphase_held_until(k.locked_at, k.lease_us, k.call_until, p_lock_timeout_us) < v_now, true);
    IF FOUND THEN
        RETURN NEXT;
    END IF;
END
$$;
CREATE OR REPLACE FUNCTION /* TEMPLATE: schema */atomicphase_record_resolution(
    p_scope text, p_key text, p_happened boolean, p_note text, p_lock_timeout_us bigint
) RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
    v_now    timestamptz := now();
    v_before "char";
    v_after  "char";
    v_point  text;
    v_tries  integer;
    v_token  bigint;
    v_workflow text;
BEGIN
    UPDATE /* TEMPLATE: schema */idempotency_keys AS k
    SET resolved_after = k.recovery_point, resolved_happened = p_happened, resolved_note = p_note,
        resolved_result = NULL, resolved_at = v_now,
        parked_at = CASE WHEN k.final_parked_at = k.parked_at THEN k.parked_at END,
        next_attempt_at = CASE WHEN k.final_parked_at = k.parked_at THEN k.next_attempt_at ELSE v_now END,
        updated_at = v_now,
        status = CASE WHEN k.status = 'p' AND k.final_parked_at = k.parked_at THEN 'p'
                      WHEN k.status = 'r' THEN 'r' WHEN k.unknown_at IS NOT NULL THEN 'u' ELSE 'w' END
    FROM (SELECT b.status FROM /* TEMPLATE: schema */idempotency_keys b
          WHERE b.scope = p_scope AND b.idempotency_key = p_key) AS before
    WHERE k.scope = p_scope AND k.idempotency_key = p_key
      AND k.status = ANY ('{r,u,p}'::"char"[]) /* from: verdict */
      AND (k.status <> 'r' OR v_now - k.locked_at > coalesce(k.lease_us, p_lock_timeout_us)::float8 * interval '1 microsecond')
      AND (k.call_until IS NULL OR k.call_until < v_now)
    RETURNING k.workflow, before.status, k.status, k.recovery_point, k.attempts, k.lock_token
    INTO v_workflow, v_before, v_after, v_point, v_tries, v_token;
    IF FOUND THEN
        PERFORM /* TEMPLATE: schema */atomicphase_key_event(p_scope, p_key, 'resolved', v_before, v_after,
            v_point, v_tries, v_token, NULL);
        RETURN NEXT v_workflow;
    END IF;
END
$$;

-- The guard on deletes: a DELETE of a key that may have paid (unfinished,
-- or parked with its outcome unknown or a call that may have gone out) is
-- refused (AP011; the statement is undone), unless its transaction says it
-- is a forced forget (atomicphase.forget_forced, which ForgetForced sets
-- after writing its audit entry) or, for a parked key and where the audit
-- trail is on the key's node (not on Citus), the trail records a forced
-- forget of it since it was parked (what a previous release's forced
-- forget writes before it deletes). Any session may set the setting: the
-- guard is against mistakes, not an access control. A deleted key's
-- history goes with it, whoever deletes it. It costs a request nothing:
-- its WHEN clause leaves out a key that finished first time (what the
-- reaper deletes), and no trigger fires on an INSERT or an UPDATE.
--
-- atomicphase_key_table_fired raises AP012 unless relation is the key
-- table or, on a Citus node, one of its shards: what the trigger
-- functions below check first, so that a role that attaches one of them
-- to a table of its own (a temporary table with the key table's columns)
-- gets an error, not the function's writes to the real tables.
CREATE FUNCTION /* TEMPLATE: schema */atomicphase_key_table_fired(p_relation oid) RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_keys oid := (SELECT t.typrelid FROM pg_catalog.pg_type t
                   WHERE t.oid OPERATOR(pg_catalog.=) pg_catalog.pg_typeof(NULL::/* TEMPLATE: schema */idempotency_keys)::pg_catalog.oid);
    v_shard boolean := false;
BEGIN
    -- Every operator named with its schema, and every comparison between
    -- values of one type: a role that may create objects on the path
    -- (MigrateOpts.AllowPublicCreate) finds nothing here to stand in for.
    IF p_relation OPERATOR(pg_catalog.=) v_keys THEN
        RETURN;
    END IF;
    -- A shard of the key table, named after it with its shard id, in its
    -- schema (read apart: pg_dist_shard is there only with Citus).
    IF EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'citus'::pg_catalog.name) THEN
        EXECUTE $q$SELECT EXISTS (
                SELECT FROM pg_catalog.pg_dist_shard s, pg_catalog.pg_class k, pg_catalog.pg_class r
                WHERE s.logicalrelid::pg_catalog.oid OPERATOR(pg_catalog.=) $1 AND k.oid OPERATOR(pg_catalog.=) $1
                  AND r.oid OPERATOR(pg_catalog.=) $2 AND r.relnamespace OPERATOR(pg_catalog.=) k.relnamespace
                  AND r.relname::pg_catalog.text OPERATOR(pg_catalog.=)
                      (k.relname::pg_catalog.text OPERATOR(pg_catalog.||) '_'::pg_catalog.text OPERATOR(pg_catalog.||) s.shardid::pg_catalog.text))$q$
            INTO v_shard USING v_keys, p_relation;
    END IF;
    IF NOT v_shard THEN
        RAISE EXCEPTION 'atomicphase''s key triggers run for its key table only, not for %', p_relation::regclass
            USING ERRCODE = 'AP012';
    END IF;
END
$$;

CREATE FUNCTION /* TEMPLATE: schema */atomicphase_key_delete() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_allowed boolean := false;
BEGIN
    PERFORM /* TEMPLATE: schema */atomicphase_key_table_fired(TG_RELID);
    IF OLD.status = 'f'
       OR (OLD.status = 'p' AND OLD.unknown_at IS NULL AND OLD.called_at IS NULL
           AND coalesce(OLD.call_until < now(), true))
       OR current_setting('atomicphase.forget_forced', true) = 'on' THEN
        v_allowed := true;
    -- The trail, where it is on the key's node (the key table's schema),
    -- read apart: a statement naming a table that is not there fails
    -- when it is planned.
    ELSIF OLD.status = 'p' AND EXISTS (
              SELECT FROM pg_catalog.pg_class c
              WHERE c.relname = 'atomicphase_audit' AND c.relnamespace = (
                  SELECT t.relnamespace FROM pg_catalog.pg_class t WHERE t.oid = TG_RELID)) THEN
        v_allowed := EXISTS (SELECT 1 FROM /* TEMPLATE: schema */atomicphase_audit a
                            WHERE a.scope = OLD.scope AND a.idempotency_key = OLD.idempotency_key
                              AND a.action = 'forget' AND a.detail @> '{"forced": true, "status_before": "parked"}'
                              AND a.at >= OLD.parked_at);
    END IF;
    IF NOT v_allowed THEN
        RAISE EXCEPTION 'idempotency key % is %, and may have paid: only a forced forget deletes it', OLD.idempotency_key,
            /* TEMPLATE: schema */atomicphase_state_name(OLD.status)
            USING ERRCODE = 'AP011';
    END IF;
    DELETE FROM /* TEMPLATE: schema */atomicphase_key_history h
    WHERE h.scope = OLD.scope AND h.idempotency_key = OLD.idempotency_key;
    RETURN NULL;
END
$$;

-- The search_path of the trigger's functions and of the history's writer:
-- the key table's schema, pg_temp last, whatever the writing session's
-- path holds (its name found from the table's row type: a schema's name
-- may be any identifier, which a string literal would have to quote). No
-- role but the owner may attach a trigger function to a table: firing one
-- asks for no EXECUTE, creating one does.
DO $$
DECLARE
    v_schema text := (SELECT n.nspname FROM pg_catalog.pg_type t
                      JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) t.typrelid
                      JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
                      WHERE t.oid OPERATOR(pg_catalog.=) pg_catalog.pg_typeof(NULL::/* TEMPLATE: schema */idempotency_keys)::pg_catalog.oid);
BEGIN
    EXECUTE pg_catalog.format('ALTER FUNCTION %I.atomicphase_key_delete() SET search_path = %I, pg_temp', v_schema, v_schema);
    EXECUTE pg_catalog.format('ALTER FUNCTION %I.atomicphase_key_table_fired(oid) SET search_path = %I, pg_temp', v_schema, v_schema);
    EXECUTE pg_catalog.format('ALTER FUNCTION %I.atomicphase_key_event(text, text, text, "char", "char", text, integer, bigint, text) SET search_path = %I, pg_temp',
        v_schema, v_schema);
END
$$;
-- PUBLIC may not attach the DELETE guard to a table of its own. On Citus,
-- which sends the REVOKE on to the workers as it deparses it, a schema
-- name that needs quoting comes out unquoted there and fails: such a
-- schema's workers keep PUBLIC's EXECUTE, which the function's check of
-- the table it fires for (above) leaves harmless.
DO $$
DECLARE
    v_fn         pg_catalog.regprocedure := '/* TEMPLATE: schema */atomicphase_key_delete()'::pg_catalog.regprocedure;
    v_propagates pg_catalog.text;
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'citus'::pg_catalog.name)
       AND (SELECT pg_catalog.quote_ident(n.nspname::pg_catalog.text) OPERATOR(pg_catalog.<>) n.nspname::pg_catalog.text
            FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace
            WHERE p.oid OPERATOR(pg_catalog.=) v_fn::pg_catalog.oid) THEN
        v_propagates := pg_catalog.current_setting('citus.enable_ddl_propagation');
        PERFORM pg_catalog.set_config('citus.enable_ddl_propagation', 'off', true);
        EXECUTE pg_catalog.format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', v_fn);
        PERFORM pg_catalog.set_config('citus.enable_ddl_propagation', v_propagates, true);
    ELSE
        EXECUTE pg_catalog.format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', v_fn);
    END IF;
END
$$;

-- On Citus, the key table may be distributed already: the trigger reads
-- only the row it fires for, and writes only its history, on its shard
-- (a setting of no effect elsewhere).
SET LOCAL citus.enable_unsafe_triggers = on;
CREATE TRIGGER atomicphase_key_delete
    AFTER DELETE ON /* TEMPLATE: schema */idempotency_keys FOR EACH ROW
    WHEN (OLD.status <> 'f' OR OLD.attempts > 1 OR OLD.resolved_at IS NOT NULL)
    EXECUTE FUNCTION /* TEMPLATE: schema */atomicphase_key_delete();
