package keystore

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The sweep's statements: the only ones on the table that read (or, for
// the reap, delete from) every shard of a distributed key table, on purpose.

// abandonedSQL picks abandoned keys of the registered workflows, the ones
// waiting longest first.
const abandonedSQL = `
SELECT scope, idempotency_key, workflow FROM /* TEMPLATE: schema */idempotency_keys
WHERE response_status IS NULL AND parked_at IS NULL
  AND workflow = ANY($1::text[])
  AND coalesce(/* TEMPLATE: schema */atomicphase_held_until(locked_at, lease_us, call_until, $2) < now(), true)
  AND (next_attempt_at IS NULL OR next_attempt_at <= now())
ORDER BY next_attempt_at NULLS FIRST
LIMIT $3`

// Ref names one key of a workflow.
type Ref struct{ Scope, Key, Workflow string }

// Abandoned returns at most limit due, unheld, unfinished keys of
// workflows, those waiting longest first.
func (s *Store) Abandoned(ctx context.Context, db DB, workflows []string, limit int) ([]Ref, error) {
	rows, err := db.Query(ctx, s.sql.abandoned, workflows, s.lockTimeoutUS, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (Ref, error) {
		var k Ref
		return k, row.Scan(&k.Scope, &k.Key, &k.Workflow)
	})
}

// unknownSQL counts abandoned keys of workflows this process does not know,
// per workflow, up to $3 keys in all.
const unknownSQL = `
SELECT workflow, count(*)::int FROM (
    SELECT workflow FROM /* TEMPLATE: schema */idempotency_keys
    WHERE response_status IS NULL AND parked_at IS NULL
      AND workflow <> ALL($1::text[])
      AND coalesce(/* TEMPLATE: schema */atomicphase_held_until(locked_at, lease_us, call_until, $2) < now(), true)
      AND (next_attempt_at IS NULL OR next_attempt_at <= now())
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

// AgeLocks moves every held lock in schema's key table back by d, and ends
// every foreign call's quiet period (call_until): the passage of time after
// a crash, the lease and the grace after a call included, without the
// wait, for tests
// (atomicphasetest.AgeLocks).
func AgeLocks(ctx context.Context, db Execer, schema string, d time.Duration) error {
	_, err := db.Exec(ctx, Render(ageLocksSQL, schema), d.Microseconds())
	return err
}
