package keystore

// The statements a request that succeeds first time sends to write its key,
// on one PostgreSQL: plain SQL, no PL/pgSQL and no trigger on the way. Each
// calls atomicphase_refuse (migration 017) only on the branch that refuses,
// which raises and so ends its batch there. On Citus the functions of the
// same names stand in for them (atomicphase_record_first,
// atomicphase_claim, atomicphase_record_unit, atomicphase_checkpoint,
// atomicphase_renew): there a plain statement's clock and transaction id
// would be the coordinator's, where the functions, delegated to the worker
// that holds the key's shard, take that worker's (docs/scale.md, "The
// clock").

// plainRecordSQL records a new key, the row as the first unit's checkpoint
// leaves it ($10 to $15: the recovery point, where a jump goes, the state,
// and a response when the unit responded, which records the key
// finished): what atomicphase_record_first and atomicphase_record_unit do.
// It takes the transaction's id before the key's times (a sweep that plans
// its watermark after created_at was read waits for this transaction) and
// the claim's advisory lock (a duplicate of a key being recorded is
// refused at once, RecordingInFlightCode, where an INSERT would wait on
// the uncommitted row), and refuses a key that exists
// (RecordedMeanwhileCode). Sent at the head of a unit (plainRecordFirstSQL),
// or at its commit after the claim (plainRecordUnitSQL, after
// plainClaimSQL, which took the lock already). Each plain statement is
// named, in a comment at its head, after the function it stands in for:
// what a statement log and pg_stat_statements show.
const plainRecordBody = `
WITH recorded AS (
    INSERT INTO /* TEMPLATE: schema */idempotency_keys AS k
        (scope, idempotency_key, workflow, fingerprint, request_method, request_path,
         state, lock_token, locked_at, created_at, updated_at, lease_us, workflow_version,
         recovery_point, next_phase, response_status, response_header, response_body, finished_at, status)
    SELECT $1::text, $2::text, $3::text, $4::bytea, $5::text, $6::text,
           $12::bytea, $7::bigint, CASE WHEN $13::integer IS NULL THEN t.now END, t.now, t.now, $8::bigint, $9::text,
           $10::text, $11::text, $13::integer, $14::jsonb, $15::bytea,
           CASE WHEN $13::integer IS NOT NULL THEN t.now END, CASE WHEN $13::integer IS NULL THEN 'r' ELSE 'f' END::"char"
    FROM (SELECT clock_timestamp() AS now WHERE pg_current_xact_id() IS NOT NULL) AS t
    WHERE CASE WHEN pg_try_advisory_xact_lock(hashtextextended($1::text || chr(31) || $2::text, 7::bigint)) THEN true
               ELSE /* TEMPLATE: schema */atomicphase_refuse('AP002', 'the idempotency key is being recorded by another request') END
    ON CONFLICT (scope, idempotency_key) DO NOTHING
    RETURNING k.downstream_salt)
SELECT coalesce((SELECT downstream_salt::text FROM recorded),
                /* TEMPLATE: schema */atomicphase_refuse('AP003', 'the idempotency key was recorded by another request meanwhile')::text)`

// plainRecordFirstSQL and plainRecordUnitSQL are plainRecordBody, named.
const (
	plainRecordFirstSQL = `/* as atomicphase_record_first(): plain SQL */` + plainRecordBody
	plainRecordUnitSQL  = `/* as atomicphase_record_unit(): plain SQL */` + plainRecordBody
)

// plainClaimSQL claims a new key for the transaction that records it at its
// commit (plainRecordSQL): the advisory lock every recording takes
// (RecordingInFlightCode when another transaction holds it), and the key's
// absence (RecordedMeanwhileCode when it exists; once the lock is ours, a
// key recorded before shows in this statement's snapshot). What
// atomicphase_claim does.
const plainClaimSQL = `/* as atomicphase_claim(): plain SQL */
SELECT CASE WHEN NOT pg_try_advisory_xact_lock(hashtextextended($1::text || chr(31) || $2::text, 7::bigint))
            THEN /* TEMPLATE: schema */atomicphase_refuse('AP002', 'the idempotency key is being recorded by another request')
            WHEN EXISTS (SELECT FROM /* TEMPLATE: schema */idempotency_keys k WHERE k.scope = $1::text AND k.idempotency_key = $2::text)
            THEN /* TEMPLATE: schema */atomicphase_refuse('AP003', 'the idempotency key was recorded by another request meanwhile') END`

// plainCheckpointSQL advances a running key's recovery point, if, and only
// if, its lock token is still the attempt's, and with a response finishes
// it, as atomicphase_checkpoint does; it raises LockLostCode when the
// token moved on, and its batch, the unit's commit, then ends there. The
// finish changes no indexed column: a HOT update.
const plainCheckpointSQL = `/* as atomicphase_checkpoint(): plain SQL */
WITH moved AS (
    UPDATE /* TEMPLATE: schema */idempotency_keys SET
        recovery_point  = $4::text,
        next_phase      = $5::text,
        state           = $6::bytea,
        locked_at       = CASE WHEN $7::integer IS NULL THEN now() END,
        response_status = $7::integer,
        response_header = $8::jsonb,
        response_body   = $9::bytea,
        finished_at     = CASE WHEN $7::integer IS NOT NULL THEN now() END,
        unknown_at      = NULL,
        next_attempt_at = CASE WHEN $7::integer IS NULL THEN next_attempt_at END,
        call_until      = NULL,
        updated_at      = now(),
        status          = CASE WHEN $7::integer IS NULL THEN 'r' ELSE 'f' END::"char"
    WHERE scope = $1::text AND idempotency_key = $2::text AND lock_token = $3::bigint
      AND status = 'r' /* from: run */
    RETURNING 1)
SELECT CASE WHEN NOT EXISTS (SELECT FROM moved)
            THEN /* TEMPLATE: schema */atomicphase_refuse('AP001', 'the idempotency key lost its lock to a newer attempt') END`

// plainRenewSQL renews a running key's lease for $4 µs from now, fenced by
// its lock token, and with $5 set marks a foreign call that may be in
// flight until $5 µs from now, as atomicphase_renew does: no row when the
// token moved on, or the key was released or finished.
const plainRenewSQL = `/* as atomicphase_renew(): plain SQL */
UPDATE /* TEMPLATE: schema */idempotency_keys SET
    locked_at = now(), lease_us = $4::bigint,
    call_until = CASE WHEN $5::bigint IS NULL THEN call_until ELSE now() + $5::bigint::float8 * interval '1 microsecond' END
WHERE scope = $1::text AND idempotency_key = $2::text AND lock_token = $3::bigint
  AND status = 'r' /* from: run */`

// keyEventSQL writes an event of a key's history (atomicphase_key_event):
// the finish of a key that went wrong, queued before its commit.
const keyEventSQL = `SELECT /* TEMPLATE: schema */atomicphase_key_event($1::text, $2::text, $3::text, $4::"char", $5::"char",
    $6::text, $7::integer, $8::bigint, NULL)`
