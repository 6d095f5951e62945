package keystore

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The sweep's statements: the only ones on the table that read (or, for
// the reap, delete from) every shard of a distributed key table, on purpose.

// abandonedSQL picks abandoned keys of the registered workflows and
// versions (and keys recorded without a version), fairly
// across scopes: at most $4 of one scope, and every scope's n-th key
// (waiting longest first) before any scope's n+1-th. The window is
// partitioned by scope, the distribution column, so on Citus each worker
// numbers its own shards' keys.
//
// It reads the keys due in two ranges of the partial index of due keys,
// those never put off (next_attempt_at NULL: running, or abandoned) and
// those whose retry is due: written as one condition (IS NULL OR <=
// now()), the planner read every unfinished key's row and filtered, and a
// backlog of keys in backoff (an outage's) cost every sweep a read of all
// of them (50 000 such keys: 24 ms, against 0.1 ms now).
const abandonedSQL = `
SELECT scope, idempotency_key, workflow FROM (
    SELECT scope, idempotency_key, workflow, next_attempt_at,
           row_number() OVER (PARTITION BY scope ORDER BY next_attempt_at NULLS FIRST, created_at) AS nth
    FROM (
        SELECT * FROM /* TEMPLATE: schema */idempotency_keys
        WHERE response_status IS NULL AND parked_at IS NULL AND next_attempt_at IS NULL
        UNION ALL
        SELECT * FROM /* TEMPLATE: schema */idempotency_keys
        WHERE response_status IS NULL AND parked_at IS NULL AND next_attempt_at <= now()) AS k
    WHERE workflow = ANY($1::text[])
      AND CASE WHEN workflow_version IS NULL
               THEN recovery_point = 'started' OR workflow || chr(31) || coalesce(next_phase, recovery_point) = ANY($6::text[])
               ELSE workflow || chr(31) || workflow_version = ANY($5::text[]) END
      AND coalesce(/* TEMPLATE: schema */atomicphase_held_until(locked_at, lease_us, call_until, $2) < now(), true)) AS due
WHERE nth <= $4::bigint
ORDER BY nth, next_attempt_at NULLS FIRST
LIMIT $3`

// Ref names one key of a workflow.
type Ref struct{ Scope, Key, Workflow string }

// Abandoned returns at most limit due, unheld, unfinished keys of
// workflows and versions, at most perScope of any one scope: every scope's longest
// waiting key first, then every scope's second, and so on.
//
// versions are the workflow versions the caller runs, each written
// VersionRef(workflow, version): a key of another version is left to the
// processes that run it. phases are the phases (VersionRef(workflow,
// phase)) the caller's definitions have: a key recorded without a version
// is picked only when it resumes after one of them, or at the start.
func (s *Store) Abandoned(ctx context.Context, db DB, workflows, versions, phases []string, limit, perScope int) ([]Ref, error) {
	rows, err := db.Query(ctx, s.sql.abandoned, workflows, s.lockTimeoutUS, limit, perScope, versions, phases)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (Ref, error) {
		var k Ref
		return k, row.Scan(&k.Scope, &k.Key, &k.Workflow)
	})
}

// unknownSQL counts abandoned keys of workflows this process does not know,
// per workflow, up to $3 keys in all; it reads the due keys as abandonedSQL
// does.
const unknownSQL = `
SELECT workflow, count(*)::int FROM (
    SELECT workflow FROM (
        SELECT * FROM /* TEMPLATE: schema */idempotency_keys
        WHERE response_status IS NULL AND parked_at IS NULL AND next_attempt_at IS NULL
        UNION ALL
        SELECT * FROM /* TEMPLATE: schema */idempotency_keys
        WHERE response_status IS NULL AND parked_at IS NULL AND next_attempt_at <= now()) AS k
    WHERE workflow <> ALL($1::text[])
      AND coalesce(/* TEMPLATE: schema */atomicphase_held_until(locked_at, lease_us, call_until, $2) < now(), true)
    LIMIT $3) AS unknown
GROUP BY workflow ORDER BY workflow`

// WorkflowCount is a number of keys of one workflow.
type WorkflowCount struct {
	Workflow string
	N        int
}

// UnknownWorkflows counts due, unheld, unfinished keys of workflows other
// than known, per workflow, counting at most limit keys in all.
func (s *Store) UnknownWorkflows(ctx context.Context, db DB, known []string, limit int) ([]WorkflowCount, error) {
	rows, err := db.Query(ctx, s.sql.unknownWorkflows, known, s.lockTimeoutUS, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (WorkflowCount, error) {
		var c WorkflowCount
		return c, row.Scan(&c.Workflow, &c.N)
	})
}

// reapSQL deletes one batch of finished keys past their retention, oldest
// first. It reads every shard of a distributed key table: on Citus the
// subquery (whose now() each worker evaluates) runs first, and the DELETE
// then goes to every shard. The DELETE matches finished_at too, so a key
// forgotten and recorded anew in between is not taken for the one read.
// Sweeps in several processes reap in turn: the second waits for the
// first's batch, finds it gone, and stops.
const reapSQL = `
DELETE FROM /* TEMPLATE: schema */idempotency_keys
WHERE (scope, idempotency_key, finished_at) IN (
    SELECT scope, idempotency_key, finished_at FROM /* TEMPLATE: schema */idempotency_keys
    WHERE response_status IS NOT NULL
      AND finished_at < now() - $1::bigint * interval '1 microsecond'
    ORDER BY finished_at
    LIMIT $2::integer)`

// Reap deletes at most batch finished keys that finished longer than
// olderThan ago, and returns how many it deleted.
func (s *Store) Reap(ctx context.Context, db DB, olderThan time.Duration, batch int) (int, error) {
	tag, err := db.Exec(ctx, s.sql.reap, olderThan.Microseconds(), batch)
	return int(tag.RowsAffected()), err
}

// reapParkedSQL deletes one batch of parked keys parked longer ago than the
// parked retention, and returns each one deleted, for the log. A key that
// may have paid without knowing it (unsettledSQL) is never reaped: it waits
// for a verdict, or an operator's forced forget. Like reapSQL
// it reads and deletes on every shard; the DELETE matches parked_at and
// the unheld, unfinished state again, so a key unparked, taken or finished
// in between is left alone.
const reapParkedSQL = `
DELETE FROM /* TEMPLATE: schema */idempotency_keys
WHERE (scope, idempotency_key, parked_at) IN (
    SELECT scope, idempotency_key, parked_at FROM /* TEMPLATE: schema */idempotency_keys
    WHERE response_status IS NULL AND parked_at IS NOT NULL
      AND parked_at < now() - $1::bigint * interval '1 microsecond'
      AND NOT ` + unsettledSQL + `
    ORDER BY parked_at
    LIMIT $2::integer)
  AND response_status IS NULL AND locked_at IS NULL AND NOT ` + unsettledSQL + `
RETURNING scope, idempotency_key, workflow, coalesce(last_error, '')`

// ReapedKey is a parked key ReapParked deleted.
type ReapedKey struct{ Scope, Key, Workflow, LastError string }

// ReapParked deletes at most batch keys parked longer than olderThan ago,
// and returns them.
func (s *Store) ReapParked(ctx context.Context, db DB, olderThan time.Duration, batch int) ([]ReapedKey, error) {
	rows, err := db.Query(ctx, s.sql.reapParked, olderThan.Microseconds(), batch)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (ReapedKey, error) {
		var k ReapedKey
		return k, row.Scan(&k.Scope, &k.Key, &k.Workflow, &k.LastError)
	})
}

// Execer runs a statement: a pool, a connection, a transaction.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// ageLocksSQL moves every held lock back by $1 microseconds. The arithmetic
// is done in UTC on timestamps without time zone, whose operators are
// immutable: Citus refuses a stable function (timestamptz minus interval is
// one) applied to a column in an UPDATE. On Citus the statement goes to
// every shard, as it means to.
const ageLocksSQL = `UPDATE /* TEMPLATE: schema */idempotency_keys
		SET locked_at = (locked_at AT TIME ZONE 'UTC' - $1::bigint * interval '1 microsecond') AT TIME ZONE 'UTC',
		    call_until = NULL
		WHERE locked_at IS NOT NULL OR call_until IS NOT NULL`

// ageBackoffsSQL makes every unfinished key due for the sweep now: the
// backoff a failed attempt set has passed. On Citus the statement goes to
// every shard, as it means to.
const ageBackoffsSQL = `UPDATE /* TEMPLATE: schema */idempotency_keys
		SET next_attempt_at = NULL
		WHERE next_attempt_at IS NOT NULL`

// AgeBackoffs makes every key in schema's key table due for the sweep: the
// passage of time after a failed attempt, for tests (the explorer's
// Scenario.Sweep).
func AgeBackoffs(ctx context.Context, db Execer, schema string) error {
	_, err := db.Exec(ctx, Render(ageBackoffsSQL, schema))
	return err
}

// AgeLocks moves every held lock in schema's key table back by d, and ends
// every foreign call's quiet period (call_until): the passage of time after
// a crash, the lease and the grace after a call included, without the
// wait, for tests
// (atomicphasetest.AgeLocks).
func AgeLocks(ctx context.Context, db Execer, schema string, d time.Duration) error {
	_, err := db.Exec(ctx, Render(ageLocksSQL, schema), d.Microseconds())
	return err
}
