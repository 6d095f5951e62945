-- The sweep finds abandoned keys without an index on the request's path
-- (migration 017 drops the indexes every request paid for). A key that
-- went wrong carries next_attempt_at, and the index of such keys
-- (idempotency_keys_waiting_idx, 017) is all the sweep reads to pick keys:
-- a failed attempt sets it to when to try again (as before), and now every
-- take of an existing key, unpark and verdict sets it too (to the present:
-- due at once, once no live attempt holds the key), where they cleared it.
-- The finish clears it, so a request that succeeds first time never
-- writes it, and its finish changes no indexed column (a HOT update).
--
-- What is left is the key that never failed and whose process died: the
-- sweep finds it in creation order, behind a watermark. Every key created
-- before atomicphase_sweep_watermark.created_before that is unfinished and
-- unparked carries next_attempt_at; the sweep moves the watermark up,
-- marking each unfinished key it passes (next_attempt_at := created_at:
-- due, once its lease is over). A key's row is stamped before its
-- transaction commits, and may show up later: the watermark moves in two
-- steps. A sweep plans how far the next may go (pending_before: the
-- present) with the transactions then in progress (pending_xmax: every
-- transaction that could still write a key created before it has an id
-- below that); a later sweep moves up to the plan once they have all
-- ended (though no nearer the present than one lock timeout), reading the
-- keys it passes then.
CREATE TABLE /* TEMPLATE: schema */atomicphase_sweep_watermark (
    name           text        PRIMARY KEY,
    created_before timestamptz NOT NULL,
    pending_before timestamptz,
    pending_xmax   xid8,
    -- On Citus, the workers' pg_snapshot_xmax at the plan, by node.
    pending_nodes  jsonb
);

-- Every unfinished key now marked, so the watermark may start here (with a
-- margin for transactions committing as this one runs).
UPDATE /* TEMPLATE: schema */idempotency_keys SET next_attempt_at = created_at
WHERE response_status IS NULL AND parked_at IS NULL AND next_attempt_at IS NULL;
INSERT INTO /* TEMPLATE: schema */atomicphase_sweep_watermark (name, created_before)
VALUES ('abandoned', now() - interval '5 minutes');

