package keystore

import (
	"context"
	"errors"
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
// It reads the keys due from the index of keys that went wrong
// (idempotency_keys_waiting_idx: next_attempt_at set, migrations 016 and
// 017): every key a failed attempt released, every key taken again, and
// every key the watermark passed unfinished (MarkPassed), so a key that
// never went wrong costs the sweep nothing.
const abandonedSQL = `
SELECT scope, idempotency_key, workflow FROM (
    SELECT scope, idempotency_key, workflow, next_attempt_at,
           row_number() OVER (PARTITION BY scope ORDER BY next_attempt_at, created_at) AS nth
    FROM /* TEMPLATE: schema */idempotency_keys
    WHERE response_status IS NULL AND parked_at IS NULL AND next_attempt_at <= now()
      AND workflow = ANY($1::text[])
      AND CASE WHEN workflow_version IS NULL
               THEN recovery_point = 'started' OR workflow || chr(31) || coalesce(next_phase, recovery_point) = ANY($6::text[])
               ELSE workflow || chr(31) || workflow_version = ANY($5::text[]) END
      AND coalesce(/* TEMPLATE: schema */atomicphase_held_until(locked_at, lease_us, call_until, $2) < now(), true)) AS due
WHERE nth <= $4::bigint
ORDER BY nth, next_attempt_at
LIMIT $3`

// The watermark (migration 016): every unfinished, unparked key created
// before it is marked due (next_attempt_at set), so the sweep finds it in
// the index of keys that went wrong. A key that never went wrong has no
// mark, and its process may die: MarkPassed moves the watermark up, in
// creation order, and marks each unfinished key it passes. A key's row is
// stamped (created_at) before its transaction commits, so it may show up
// after its time: the watermark moves in two steps. A sweep plans how far
// the next may go, the present, with the transactions then in progress
// (every one that could still write a key created before it has an id
// below pg_snapshot_xmax); a later sweep moves up to that plan once they
// have all ended, though no nearer the present than one lock timeout (a
// younger key is most likely running: a mark now would cost its finish its
// HOT update), and reads the keys it passes. A long write
// transaction anywhere in the database holds the watermark back (as it
// holds back vacuum). On Citus a key's transaction runs on the worker that
// holds it, which the coordinator's snapshot does not show: there the plan
// also records each worker's, and waits for each.

// watermarkSQL reads the watermark, its plan, whether the plan's
// transactions have all ended, the nearest the watermark may come to the
// present (one lock timeout, $1, before it), a new plan (the present, with
// the transactions in progress now), the workers' part of the plan, and
// whether the database runs Citus.
const watermarkSQL = `
SELECT coalesce(w.created_before, '-infinity'), w.pending_before,
       coalesce(pg_snapshot_xmin(pg_current_snapshot()) >= w.pending_xmax, false),
       now() - $1::bigint * interval '1 microsecond',
       now(), pg_snapshot_xmax(pg_current_snapshot())::text, w.pending_nodes,
       EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'citus')
FROM (SELECT) AS one
LEFT JOIN /* TEMPLATE: schema */atomicphase_sweep_watermark w ON w.name = 'abandoned'`

// workersXmaxSQL reads each Citus worker's pg_snapshot_xmax, by node (NULL
// when a worker did not answer).
const workersXmaxSQL = `
SELECT CASE WHEN bool_and(success) THEN jsonb_object_agg(nodename || ':' || nodeport, result) END
FROM run_command_on_workers('SELECT pg_snapshot_xmax(pg_current_snapshot())::text')`

// workersSettledSQL reports whether every Citus worker's transactions that
// were in progress at the plan ($1, workersXmaxSQL's) have ended: its
// pg_snapshot_xmin has passed the xmax it had then. A worker that does not
// answer is not settled; one added since has none of them.
const workersSettledSQL = `
SELECT coalesce(bool_and(success AND ($1::jsonb ->> (nodename || ':' || nodeport) IS NULL
                                     OR result::xid8 >= ($1::jsonb ->> (nodename || ':' || nodeport))::xid8)), true)
FROM run_command_on_workers('SELECT pg_snapshot_xmin(pg_current_snapshot())::text')`

// planWatermarkSQL records the watermark's next position ($1) and the
// transactions it waits for ($2; on Citus, $3: the workers').
const planWatermarkSQL = `
INSERT INTO /* TEMPLATE: schema */atomicphase_sweep_watermark AS w (name, created_before, pending_before, pending_xmax, pending_nodes)
VALUES ('abandoned', '-infinity', $1::timestamptz, $2::text::xid8, $3::jsonb)
ON CONFLICT (name) DO UPDATE SET pending_before = excluded.pending_before, pending_xmax = excluded.pending_xmax,
                                 pending_nodes = excluded.pending_nodes`

// passedSQL lists the unmarked unfinished keys created in [$1, $2), oldest
// first, at most $3.
const passedSQL = `
SELECT scope, idempotency_key, created_at FROM /* TEMPLATE: schema */idempotency_keys
WHERE created_at >= $1::timestamptz AND created_at < $2::timestamptz
  AND response_status IS NULL AND parked_at IS NULL AND next_attempt_at IS NULL
ORDER BY created_at
LIMIT $3::integer`

// markPassedSQL marks one passed key due from its creation (a past time, so
// it is due as soon as no live attempt holds it), unless it finished,
// parked or was marked since. No time function: on Citus it is routed to
// the key's worker as it is.
const markPassedSQL = `
UPDATE /* TEMPLATE: schema */idempotency_keys SET next_attempt_at = created_at
WHERE scope = $1::text AND idempotency_key = $2::text
  AND response_status IS NULL AND parked_at IS NULL AND next_attempt_at IS NULL`

// moveWatermarkSQL moves the watermark up to $1, never back (sweeps in
// several processes move it in turn).
const moveWatermarkSQL = `
UPDATE /* TEMPLATE: schema */atomicphase_sweep_watermark AS w SET created_before = greatest(w.created_before, $1::timestamptz)
WHERE w.name = 'abandoned'`

// MarkPassed moves the sweep's watermark up to its plan (no nearer the
// present than one lock timeout), once the plan's transactions have ended, marking due the unfinished keys it passes, at
// most limit of them (the watermark then stops at the last one, and the
// next call goes on from there); then it plans the next move. It returns
// how many keys it marked. Its cost is one read of each key created since
// the last move.
func (s *Store) MarkPassed(ctx context.Context, db Batcher, limit int) (int, error) {
	var from, nearest, plan time.Time
	var pending *time.Time
	var settled bool
	var xmax string
	var nodes []byte
	var citus bool
	if err := db.QueryRow(ctx, s.sql.watermark, s.lockTimeoutUS).Scan(&from, &pending, &settled, &nearest, &plan, &xmax, &nodes, &citus); err != nil {
		return 0, err
	}
	if pending != nil && settled && citus {
		if nodes == nil {
			settled = false // planned without the workers' (their answer failed)
		} else if err := db.QueryRow(ctx, workersSettledSQL, nodes).Scan(&settled); err != nil {
			return 0, err
		}
	}
	if pending != nil && !settled {
		return 0, nil // a transaction that may still write a key before the plan runs
	}
	n := 0
	if pending != nil && pending.After(nearest) {
		pending = &nearest
	}
	if pending != nil && pending.After(from) {
		to := *pending
		rows, err := db.Query(ctx, s.sql.passed, from, to, limit)
		if err != nil {
			return 0, err
		}
		type passedKey struct {
			scope, key string
			created    time.Time
		}
		keys, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (passedKey, error) {
			var k passedKey
			return k, row.Scan(&k.scope, &k.key, &k.created)
		})
		if err != nil {
			return 0, err
		}
		if len(keys) > 0 {
			b := &pgx.Batch{}
			for _, k := range keys {
				b.Queue(s.sql.markPassed, k.scope, k.key)
			}
			res := db.SendBatch(ctx, b)
			for range keys {
				tag, err := res.Exec()
				if err != nil {
					_ = res.Close()
					return n, err
				}
				n += int(tag.RowsAffected())
			}
			if err := res.Close(); err != nil {
				return n, err
			}
		}
		if len(keys) == limit {
			// More may follow: stop at the last key passed (its peers of
			// the same instant are read again, and are marked), and keep
			// the plan.
			_, err := db.Exec(ctx, s.sql.moveWatermark, keys[len(keys)-1].created)
			return n, err
		}
		if _, err := db.Exec(ctx, s.sql.moveWatermark, to); err != nil {
			return n, err
		}
	}
	var workers []byte
	if citus {
		// The workers stamp keys with their own clocks: a second's
		// allowance for theirs being behind the coordinator's.
		plan = plan.Add(-time.Second)
		// After the coordinator's own reading: a worker's transaction that
		// began before the plan began before this too.
		if err := db.QueryRow(ctx, workersXmaxSQL).Scan(&workers); err != nil {
			return n, err
		}
	}
	_, err := db.Exec(ctx, s.sql.planWatermark, plan, xmax, workers)
	return n, err
}

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
    SELECT workflow FROM /* TEMPLATE: schema */idempotency_keys
    WHERE response_status IS NULL AND parked_at IS NULL AND next_attempt_at <= now()
      AND workflow <> ALL($1::text[])
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

// The reapers pick a batch of keys (a read of every shard of a
// distributed key table, oldest first), then delete each picked key with a
// statement of its own, all sent in one round trip without BEGIN: on
// Citus each of them commits alone on the worker that holds its key (one
// DELETE over the whole batch spans workers, and committed in two phases:
// a server killed between them left a prepared transaction behind, which
// kept its database from being dropped until Citus recovered it); on one
// PostgreSQL the batch is one implicit transaction. Each DELETE matches
// the picked key's state again, so a key forgotten and recorded anew, or
// unparked, taken or finished, in between is left alone. Sweeps in several
// processes reap in turn: what one deleted, the other's DELETE finds gone.

// reapPickSQL picks one batch of finished keys past their retention,
// oldest first (the subquery's now() each worker evaluates). It reads the
// keys in creation order (no index of finished keys: a finish that wrote
// one would not be a HOT update): a key finishes after it is created, so
// every key finished before the retention was created before it too, and
// the keys it passes over are the few still unfinished, or finished since.
const reapPickSQL = `
SELECT scope, idempotency_key, finished_at FROM /* TEMPLATE: schema */idempotency_keys
WHERE created_at < now() - $1::bigint * interval '1 microsecond'
  AND response_status IS NOT NULL
  AND finished_at < now() - $1::bigint * interval '1 microsecond'
ORDER BY created_at
LIMIT $2::integer`

// reapOneSQL deletes one picked finished key.
const reapOneSQL = `
DELETE FROM /* TEMPLATE: schema */idempotency_keys
WHERE scope = $1::text AND idempotency_key = $2::text AND finished_at = $3::timestamptz`

// Batcher runs statements and batches: a pool or a connection.
type Batcher interface {
	DB
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// picked is a key a reaper picked, with the time it is picked by, and for
// a parked key what it was judged settled by.
type picked struct {
	scope, key           string
	at                   time.Time
	token                int64
	unknownAt, callUntil *time.Time
}

// pick runs a reaper's pick (parked: the pick of parked keys).
func pick(ctx context.Context, db DB, sql string, olderThan time.Duration, batch int, parked bool) ([]picked, error) {
	rows, err := db.Query(ctx, sql, olderThan.Microseconds(), batch)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (picked, error) {
		var p picked
		if parked {
			return p, row.Scan(&p.scope, &p.key, &p.at, &p.token, &p.unknownAt, &p.callUntil)
		}
		return p, row.Scan(&p.scope, &p.key, &p.at)
	})
}

// Reap deletes at most batch finished keys that finished longer than
// olderThan ago, and returns how many it deleted.
func (s *Store) Reap(ctx context.Context, db Batcher, olderThan time.Duration, batch int) (int, error) {
	keys, err := pick(ctx, db, s.sql.reapPick, olderThan, batch, false)
	if err != nil || len(keys) == 0 {
		return 0, err
	}
	b := &pgx.Batch{}
	for _, k := range keys {
		b.Queue(s.sql.reapOne, k.scope, k.key, k.at)
	}
	res := db.SendBatch(ctx, b)
	n := 0
	for range keys {
		tag, err := res.Exec()
		if err != nil {
			_ = res.Close()
			return n, err
		}
		n += int(tag.RowsAffected())
	}
	return n, res.Close()
}

// reapParkedPickSQL picks one batch of parked keys parked longer ago than
// the parked retention. A key that may have paid without knowing it
// (unsettledSQL) is never reaped: it waits for a verdict, or an operator's
// forced forget.
const reapParkedPickSQL = `
SELECT scope, idempotency_key, parked_at, lock_token, unknown_at, call_until FROM /* TEMPLATE: schema */idempotency_keys
WHERE response_status IS NULL AND parked_at IS NOT NULL
  AND parked_at < now() - $1::bigint * interval '1 microsecond'
  AND NOT ` + unsettledSQL + `
ORDER BY parked_at
LIMIT $2::integer`

// reapParkedOneSQL deletes one picked parked key, still parked then and
// unheld, as it was picked: the same lock token, and the same
// unknown-outcome and call marks, which the pick judged settled (a mark,
// once past, stays past), so that the statement takes no time of its own.
// It returns the key for the log.
const reapParkedOneSQL = `
DELETE FROM /* TEMPLATE: schema */idempotency_keys
WHERE scope = $1::text AND idempotency_key = $2::text AND parked_at = $3::timestamptz
  AND response_status IS NULL AND locked_at IS NULL AND lock_token = $4::bigint
  AND unknown_at IS NOT DISTINCT FROM $5::timestamptz AND call_until IS NOT DISTINCT FROM $6::timestamptz
RETURNING scope, idempotency_key, workflow, coalesce(last_error, '')`

// ReapedKey is a parked key ReapParked deleted.
type ReapedKey struct{ Scope, Key, Workflow, LastError string }

// ReapParked deletes at most batch keys parked longer than olderThan ago,
// and returns them.
func (s *Store) ReapParked(ctx context.Context, db Batcher, olderThan time.Duration, batch int) ([]ReapedKey, error) {
	keys, err := pick(ctx, db, s.sql.reapParkedPick, olderThan, batch, true)
	if err != nil || len(keys) == 0 {
		return nil, err
	}
	b := &pgx.Batch{}
	for _, k := range keys {
		b.Queue(s.sql.reapParkedOne, k.scope, k.key, k.at, k.token, k.unknownAt, k.callUntil)
	}
	res := db.SendBatch(ctx, b)
	var out []ReapedKey
	for range keys {
		var k ReapedKey
		switch err := res.QueryRow().Scan(&k.Scope, &k.Key, &k.Workflow, &k.LastError); {
		case errors.Is(err, pgx.ErrNoRows): // changed since it was picked
		case err != nil:
			_ = res.Close()
			return out, err
		default:
			out = append(out, k)
		}
	}
	return out, res.Close()
}

// Execer runs a statement: a pool, a connection, a transaction.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// ageLocksSQL moves every held lock back by $1 microseconds, and marks each
// unfinished key it ages as the sweep's watermark would once the time had
// passed (MarkPassed): due once its lease is over. The arithmetic
// is done in UTC on timestamps without time zone, whose operators are
// immutable: Citus refuses a stable function (timestamptz minus interval is
// one) applied to a column in an UPDATE. On Citus the statement goes to
// every shard, as it means to.
const ageLocksSQL = `UPDATE /* TEMPLATE: schema */idempotency_keys
		SET locked_at = (locked_at AT TIME ZONE 'UTC' - $1::bigint * interval '1 microsecond') AT TIME ZONE 'UTC',
		    call_until = NULL,
		    next_attempt_at = CASE WHEN response_status IS NULL AND parked_at IS NULL AND unknown_at IS NOT NULL THEN created_at
		                           WHEN response_status IS NULL AND parked_at IS NULL
		                           THEN coalesce(next_attempt_at, created_at) ELSE next_attempt_at END
		WHERE locked_at IS NOT NULL OR call_until IS NOT NULL
		   OR (response_status IS NULL AND parked_at IS NULL AND (next_attempt_at IS NULL OR unknown_at IS NOT NULL))`

// ageBackoffsSQL makes every unfinished key due for the sweep now: the
// backoff a failed attempt set has passed (a due key's next_attempt_at is
// in the past; its creation time is). On Citus the statement goes to every
// shard, as it means to.
const ageBackoffsSQL = `UPDATE /* TEMPLATE: schema */idempotency_keys
		SET next_attempt_at = created_at
		WHERE next_attempt_at IS NOT NULL`

// AgeBackoffs makes every key in schema's key table due for the sweep: the
// passage of time after a failed attempt, for tests (the explorer's
// Scenario.Sweep).
func AgeBackoffs(ctx context.Context, db Execer, schema string) error {
	_, err := db.Exec(ctx, Render(ageBackoffsSQL, schema))
	return err
}

// AgeLocks moves every held lock in schema's key table back by d, and ends
// every foreign call's quiet period (call_until) and every reconciliation's
// backoff (a key whose outcome is unknown is made due): the passage of time
// after a crash, the lease and the grace after a call included, and a
// client's wait for its Retry-After, without the wait, for tests
// (atomicphasetest.AgeLocks).
func AgeLocks(ctx context.Context, db Execer, schema string, d time.Duration) error {
	_, err := db.Exec(ctx, Render(ageLocksSQL, schema), d.Microseconds())
	return err
}
