-- One stored state per key, and the database holding every writer to the
-- transition table (key_state.go). Expand only: a column and triggers, no
-- function a release calls is changed, so a previous release keeps working
-- while this one rolls out, and its writes are held to the same table.
--
-- status is one of running (an attempt holds the key: its lease, running
-- or run out), waiting (nobody holds it: to be resumed, by a retry or the
-- sweep), unknown (nobody holds it, and a foreign call's outcome is
-- unknown), parked, finished. Time changes none of them: a running key
-- whose lease ran out (stale) and a waiting key in a call's quiet period
-- are what a reader makes of the status and the lease, never a write.
--
-- A key that never went wrong has none (NULL): it is running until its
-- response is stored, and finished after. Its finish thus leaves the
-- column alone: the column is the table's last, and a finish that
-- changed it would end PostgreSQL's compression of the HOT update's WAL
-- record at the row's end (48 more bytes a request, measured). Once a key
-- leaves that path (it fails, waits, is parked, is taken over), its state
-- is stored on every write after, to the end. A key recorded before this migration has
-- none until its next write. So coalesce(status, atomicphase_status_of(...))
-- is every key's state.

-- On Citus, the key table may be distributed already, and the triggers
-- below read only the row they fire for, on its shard (a setting of no
-- effect elsewhere), and its multi-shard commands must run in order (as
-- Migrate has them run) for the functions after them to be created.
SET LOCAL citus.enable_unsafe_triggers = on;
SET LOCAL citus.multi_shard_modify_mode TO 'sequential';
ALTER TABLE /* TEMPLATE: schema */idempotency_keys ADD COLUMN status text;

-- A key's history: what went wrong with it, one row per event, written by
-- the trigger below only when something does (an attempt that failed, or
-- left an outcome unknown, or parked the key; a take of a key that went
-- wrong, or of one whose holder's lease ran out; an unpark, a verdict; the
-- finish of a key that went wrong). A request that
-- succeeds first time writes none. Operators' actions, with who took them,
-- are in atomicphase_audit. Deleted with its key.
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
-- on the same shards, before any trigger writes it. (A new install's is
-- distributed with the key table, CitusDistribution.)
DO $$
DECLARE
    -- The tables, named without a string literal (the schema's name is
    -- any identifier): by their row types.
    v_keys    regclass := (SELECT t.typrelid FROM pg_catalog.pg_type t
                           WHERE t.oid OPERATOR(pg_catalog.=) pg_catalog.pg_typeof(NULL::/* TEMPLATE: schema */idempotency_keys)::pg_catalog.oid);
    v_history regclass := (SELECT t.typrelid FROM pg_catalog.pg_type t
                           WHERE t.oid OPERATOR(pg_catalog.=) pg_catalog.pg_typeof(NULL::/* TEMPLATE: schema */atomicphase_key_history)::pg_catalog.oid);
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'citus'::pg_catalog.name) THEN
        IF EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = v_keys) THEN
            PERFORM create_distributed_table(v_history, 'scope', colocate_with := v_keys::text);
        END IF;
    END IF;
END
$$;

-- atomicphase_status_of is the state a key's columns put it in: the one
-- definition, which the triggers below store in status on every write.
-- A plain SQL expression, inlined where it is used.
CREATE FUNCTION /* TEMPLATE: schema */atomicphase_status_of(
    p_response_status integer, p_parked_at timestamptz, p_locked_at timestamptz, p_unknown_at timestamptz
) RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN p_response_status IS NOT NULL THEN 'finished'
        WHEN p_parked_at IS NOT NULL THEN 'parked'
        WHEN p_locked_at IS NOT NULL THEN 'running'
        WHEN p_unknown_at IS NOT NULL THEN 'unknown'
        ELSE 'waiting' END
$$;

-- atomicphase_status_may_change says whether one write may move a key
-- from one state to another: every pair that some operation of
-- key_state.go's table allows (TestKeyStateTableIsTheDatabases holds the
-- two together). A finished key's answer is final.
CREATE FUNCTION /* TEMPLATE: schema */atomicphase_status_may_change(p_from text, p_to text)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT p_from || '>' || p_to = ANY ('{
        running>running, running>waiting, running>unknown, running>parked, running>finished,
        waiting>waiting, waiting>running, waiting>unknown, waiting>parked, waiting>finished,
        unknown>unknown, unknown>running, unknown>waiting, unknown>parked, unknown>finished,
        parked>parked, parked>running, parked>waiting, parked>unknown, parked>finished,
        finished>finished}'::text[])
$$;

-- atomicphase_deletable says whether a key may be deleted without a forced
-- forget: a finished key, or a parked one nobody holds whose outcome is
-- settled (no unknown outcome, no call that may have gone out, no call's
-- quiet period to come). Deleting any other would let a retry record the
-- key anew, with a new downstream salt, and pay again.
CREATE FUNCTION /* TEMPLATE: schema */atomicphase_deletable(
    p_response_status integer, p_parked_at timestamptz, p_locked_at timestamptz,
    p_unknown_at timestamptz, p_called_at timestamptz, p_call_until timestamptz
) RETURNS boolean LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT p_response_status IS NOT NULL
        OR (p_parked_at IS NOT NULL AND p_locked_at IS NULL AND p_unknown_at IS NULL
            AND p_called_at IS NULL AND coalesce(p_call_until < now(), true))
$$;

-- The triggers. AFTER triggers, each with a WHEN clause of plain column
-- tests that is false for a request that succeeds first time, so that
-- such a request pays nothing: a BEFORE UPDATE or DELETE row trigger
-- makes PostgreSQL lock the row first, one more WAL record (54 bytes) for
-- every write, and a function named in a WHEN clause is inlined, its body
-- parsed, for every statement (docs/performance.md).
--
-- The functions grant nothing: they run as the role whose write fired
-- them (not as their owner), so a writer needs its own grants on the
-- history and the audit trail (docs/security-and-limits.md, "Database
-- roles"; the check at the end of this file), and each one refuses,
-- before it reads anything of the row, to run for any table but the key
-- table (atomicphase_key_table_fired), and may be attached to a table by
-- no role but their owner (EXECUTE is revoked from PUBLIC below: firing
-- a trigger asks for no EXECUTE, creating one does). Their search_path is
-- the key table's schema alone (set below, pg_temp last, so that no
-- session's temporary table stands in for one of theirs), whatever the
-- writing session's path holds.

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

-- atomicphase_key_status: after a write that moves a key off the happy
-- path or along it after (the WHEN clause: everything but a write of a
-- running key that never went wrong, under the same token, leaving it
-- running or finished, no verdict, and its status untouched), it refuses
-- a change no operation may make (AP010; the statement is undone), writes
-- the key's history, and stores its state. The store is a second update
-- of the row, made from the trigger, which changes the status only, and
-- fires nothing (a write from inside a trigger that changes the status).
CREATE FUNCTION /* TEMPLATE: schema */atomicphase_key_status() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_from   text;
    v_to     text;
    v_status text;
    v_event  text;
BEGIN
    -- Only for the key table (see atomicphase_key_table_fired): nothing
    -- of NEW or OLD is read before.
    PERFORM /* TEMPLATE: schema */atomicphase_key_table_fired(TG_RELID);
    v_from := /* TEMPLATE: schema */atomicphase_status_of(OLD.response_status, OLD.parked_at, OLD.locked_at, OLD.unknown_at);
    v_to := /* TEMPLATE: schema */atomicphase_status_of(NEW.response_status, NEW.parked_at, NEW.locked_at, NEW.unknown_at);
    IF NOT /* TEMPLATE: schema */atomicphase_status_may_change(v_from, v_to) THEN
        RAISE EXCEPTION 'idempotency key % is %: no operation makes it %', OLD.idempotency_key, v_from, v_to
            USING ERRCODE = 'AP010';
    END IF;
    IF v_from = v_to THEN
        v_event := CASE
            WHEN v_to = 'running' AND NEW.lock_token <> OLD.lock_token THEN 'taken_over'
            WHEN NEW.resolved_at IS DISTINCT FROM OLD.resolved_at THEN 'resolved' END;
    ELSIF v_to = 'finished' THEN
        v_event := CASE WHEN OLD.status IS NOT NULL THEN 'finished' END;
    ELSIF v_from = 'running' THEN
        v_event := CASE v_to WHEN 'waiting' THEN 'failed' ELSE v_to END;
    ELSIF NEW.resolved_at IS DISTINCT FROM OLD.resolved_at THEN
        v_event := 'resolved';
    ELSIF v_to = 'running' THEN
        v_event := 'resumed';
    ELSIF v_from = 'parked' THEN
        v_event := 'unparked';
    ELSIF v_to IN ('parked', 'unknown') THEN
        v_event := v_to;
    ELSE
        v_event := 'settled'; -- an unknown outcome settled, no attempt holding the key
    END IF;
    -- A key on the happy path, which no event marks, keeps no status
    -- (see the column); once one does, the key keeps its state, to the
    -- end, and its delete finds its history.
    v_status := CASE WHEN v_event IS NULL AND OLD.status IS NULL AND v_from IN ('running', 'finished')
                          AND v_to IN ('running', 'finished') THEN NULL
                     ELSE v_to END;
    IF v_event IS NOT NULL THEN
        INSERT INTO /* TEMPLATE: schema */atomicphase_key_history
            (scope, idempotency_key, event, status_before, status, recovery_point, attempt, lock_token, error)
        VALUES (NEW.scope, NEW.idempotency_key, v_event, v_from, v_to, NEW.recovery_point, NEW.attempts,
                CASE WHEN v_to = 'running' THEN NEW.lock_token ELSE OLD.lock_token END,
                CASE WHEN v_from = 'running' AND v_to IN ('waiting', 'unknown', 'parked') THEN NEW.last_error END);
        IF v_to = 'finished' THEN
            -- A finished key keeps no error text (it may quote what the
            -- client sent), as its last_error goes.
            UPDATE /* TEMPLATE: schema */atomicphase_key_history h SET error = NULL
            WHERE h.scope = NEW.scope AND h.idempotency_key = NEW.idempotency_key AND h.error IS NOT NULL;
        ELSE
            -- A key keeps its newest 1000 events. (In time order: on
            -- Citus an event's id depends on the node its shard is on.)
            DELETE FROM /* TEMPLATE: schema */atomicphase_key_history h
            WHERE h.scope = NEW.scope AND h.idempotency_key = NEW.idempotency_key
              AND (h.at, h.id) <= (SELECT o.at, o.id FROM /* TEMPLATE: schema */atomicphase_key_history o
                                   WHERE o.scope = NEW.scope AND o.idempotency_key = NEW.idempotency_key
                                   ORDER BY o.at DESC, o.id DESC OFFSET 1000 LIMIT 1);
        END IF;
    END IF;
    IF v_status IS DISTINCT FROM NEW.status THEN
        UPDATE /* TEMPLATE: schema */idempotency_keys k SET status = v_status
        WHERE k.scope = NEW.scope AND k.idempotency_key = NEW.idempotency_key;
    END IF;
    RETURN NULL;
END
$$;

-- atomicphase_key_delete: a key that is not deletable
-- (atomicphase_deletable) is deleted only by a forced forget, and any
-- other DELETE, a hand-written one included, is refused (AP011; the
-- statement is undone). A forced forget is one whose transaction says so
-- (atomicphase.forget_forced, which ForgetForced sets), or, for a parked
-- key and where the trail is on the key's node (not on Citus), one the
-- audit trail records (action forget, forced, of the key parked, since it
-- was parked: what ForgetForced of this release and the previous one
-- writes before it deletes). A key's history goes with it. The WHEN
-- clause leaves out a key that never went wrong and may be deleted (what
-- the reaper deletes).
CREATE FUNCTION /* TEMPLATE: schema */atomicphase_key_delete() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_allowed boolean := false;
BEGIN
    PERFORM /* TEMPLATE: schema */atomicphase_key_table_fired(TG_RELID);
    IF /* TEMPLATE: schema */atomicphase_deletable(OLD.response_status, OLD.parked_at, OLD.locked_at,
                                                   OLD.unknown_at, OLD.called_at, OLD.call_until)
       OR current_setting('atomicphase.forget_forced', true) = 'on' THEN
        v_allowed := true;
    -- The trail, where it is on the key's node (the key table's schema),
    -- read apart: a statement naming a table that is not there fails
    -- when it is planned.
    ELSIF OLD.parked_at IS NOT NULL AND OLD.locked_at IS NULL AND EXISTS (
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
            /* TEMPLATE: schema */atomicphase_status_of(OLD.response_status, OLD.parked_at, OLD.locked_at, OLD.unknown_at)
            USING ERRCODE = 'AP011';
    END IF;
    DELETE FROM /* TEMPLATE: schema */atomicphase_key_history h
    WHERE h.scope = OLD.scope AND h.idempotency_key = OLD.idempotency_key;
    RETURN NULL;
END
$$;

-- The functions' search_path: the key table's schema, pg_temp last. (Its
-- name found from the table's row type: a schema's name may be any
-- identifier, which a string literal would have to quote.)
DO $$
DECLARE
    v_schema text := (SELECT n.nspname FROM pg_catalog.pg_type t
                      JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) t.typrelid
                      JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
                      WHERE t.oid OPERATOR(pg_catalog.=) pg_catalog.pg_typeof(NULL::/* TEMPLATE: schema */idempotency_keys)::pg_catalog.oid);
BEGIN
    EXECUTE pg_catalog.format('ALTER FUNCTION %I.atomicphase_key_status() SET search_path = %I, pg_temp', v_schema, v_schema);
    EXECUTE pg_catalog.format('ALTER FUNCTION %I.atomicphase_key_delete() SET search_path = %I, pg_temp', v_schema, v_schema);
    EXECUTE pg_catalog.format('ALTER FUNCTION %I.atomicphase_key_table_fired(oid) SET search_path = %I, pg_temp', v_schema, v_schema);
END
$$;
REVOKE EXECUTE ON FUNCTION /* TEMPLATE: schema */atomicphase_key_status() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION /* TEMPLATE: schema */atomicphase_key_delete() FROM PUBLIC;

-- The history's grants: each role granted UPDATE or DELETE on the key
-- table (PUBLIC too, where it is) gets SELECT, INSERT, UPDATE and DELETE
-- on the history, which its writes of the key table now make as its own
-- (a previous release, running as such a role while this one rolls out,
-- thus keeps working). A role granted the key table later needs them too
-- (docs/security-and-limits.md, "Database roles").
DO $$
DECLARE
    v_keys    regclass := (SELECT t.typrelid FROM pg_catalog.pg_type t
                           WHERE t.oid OPERATOR(pg_catalog.=) pg_catalog.pg_typeof(NULL::/* TEMPLATE: schema */idempotency_keys)::pg_catalog.oid);
    v_history regclass := (SELECT t.typrelid FROM pg_catalog.pg_type t
                           WHERE t.oid OPERATOR(pg_catalog.=) pg_catalog.pg_typeof(NULL::/* TEMPLATE: schema */atomicphase_key_history)::pg_catalog.oid);
    v_grantee text;
BEGIN
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

-- The triggers, their functions ready.
CREATE TRIGGER atomicphase_key_status
    AFTER UPDATE ON /* TEMPLATE: schema */idempotency_keys FOR EACH ROW
    WHEN (NOT (pg_trigger_depth() > 0 AND NEW.status IS DISTINCT FROM OLD.status)
          AND NOT (NEW.status IS NOT DISTINCT FROM OLD.status
                   AND OLD.status IS NULL AND OLD.response_status IS NULL AND OLD.parked_at IS NULL
                   AND OLD.locked_at IS NOT NULL AND NEW.parked_at IS NULL
                   AND (NEW.locked_at IS NOT NULL OR NEW.response_status IS NOT NULL)
                   AND NEW.lock_token = OLD.lock_token
                   AND NEW.resolved_at IS NOT DISTINCT FROM OLD.resolved_at))
    EXECUTE FUNCTION /* TEMPLATE: schema */atomicphase_key_status();

CREATE TRIGGER atomicphase_key_delete
    AFTER DELETE ON /* TEMPLATE: schema */idempotency_keys FOR EACH ROW
    WHEN (OLD.status IS NOT NULL
          OR NOT (OLD.response_status IS NOT NULL
                  OR (OLD.parked_at IS NOT NULL AND OLD.locked_at IS NULL AND OLD.unknown_at IS NULL
                      AND OLD.called_at IS NULL AND (OLD.call_until IS NULL OR OLD.call_until < now()))))
    EXECUTE FUNCTION /* TEMPLATE: schema */atomicphase_key_delete();
