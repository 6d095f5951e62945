package atomicphase_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
)

// events are the (event, from, to) of a key's history, in order.
func events(t *testing.T, b *testBundle, key string) [][3]string {
	t.Helper()
	h, err := b.runner.KeyHistory(b.ctx, "driver_1", key, 0)
	require.NoError(t, err)
	out := make([][3]string, len(h))
	for i, e := range h {
		out[i] = [3]string{e.Event, e.StatusBefore, e.Status}
	}
	return out
}

// historyRows counts the rows of the history table, every key's.
func historyRows(t *testing.T, b *testBundle) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM atomicphase_key_history`).Scan(&n))
	return n
}

// A key's history is what went wrong with it, in order: the failed
// attempt and why, the retry that took it, the finish after it. A key
// that succeeds first time, or is replayed, writes none.
func TestKeyHistoryRecordsWhatWentWrong(t *testing.T) {
	t.Parallel()
	b := setup(t, syncBankConfig())
	bk := newBank()
	var faults modelFaults
	faults.set("", false)
	wf := modelWorkflow(bk, &faults)

	_, err := b.runner.Run(b.ctx, wf, payoutRequest("fine"))
	require.NoError(t, err)
	resp, err := b.runner.Run(b.ctx, wf, payoutRequest("fine"))
	require.NoError(t, err)
	require.True(t, resp.Replayed)
	require.Empty(t, events(t, b, "fine"))
	require.Zero(t, historyRows(t, b), "a request that succeeds first time writes no history")

	faults.transient.Store(true)
	_, err = b.runner.Run(b.ctx, wf, payoutRequest("k"))
	require.Error(t, err)
	h, err := b.runner.KeyHistory(b.ctx, "driver_1", "k", 0)
	require.NoError(t, err)
	require.Len(t, h, 1)
	require.NotNil(t, h[0].Error)
	require.Contains(t, *h[0].Error, "a passing fault in prepare", "why the attempt failed")
	faults.transient.Store(false)
	_, err = b.runner.Run(b.ctx, wf, payoutRequest("k"))
	require.NoError(t, err)
	require.Equal(t, [][3]string{
		{"failed", "running", "waiting"},
		{"resumed", "waiting", "running"},
		{"finished", "running", "finished"},
	}, events(t, b, "k"))
	h, err = b.runner.KeyHistory(b.ctx, "driver_1", "k", 0)
	require.NoError(t, err)
	require.Nil(t, h[0].Error, "a finished key keeps no error text, as its last error goes")
	require.Equal(t, 1, h[0].Attempt)
	require.Equal(t, 2, h[1].Attempt)
	require.NotEqual(t, h[0].LockToken, h[1].LockToken, "each event names its attempt")
	require.Nil(t, h[1].Error)
	require.True(t, h[0].At.Before(h[2].At) || h[0].At.Equal(h[2].At))
	var status string
	for _, key := range []string{"k", "fine"} {
		require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT status::text FROM idempotency_keys WHERE scope = 'driver_1' AND idempotency_key = $1`, key).Scan(&status))
		require.Equal(t, "f", status, "%s: every key's state is stored", key)
	}
	last, err := b.runner.KeyHistory(b.ctx, "driver_1", "k", 1)
	require.NoError(t, err)
	require.Len(t, last, 1, "the limit holds")
	require.Equal(t, "finished", last[0].Event, "on the newest events")
}

// Parked with its outcome unknown, given a verdict, resumed, finished;
// then a held key taken over once its holder's lease ran out; and a
// forgotten key's history goes with it.
func TestKeyHistoryOfAParkedKeyAndATakeover(t *testing.T) {
	t.Parallel()
	b := setup(t, &atomicphase.Config{CallGrace: time.Nanosecond, MaxAttempts: 2})
	bk := newBank()
	wf := payoutWorkflow(bk)
	parkUnknown(t, b, bk, wf, "p")
	require.NoError(t, b.runner.RecordResolution(b.ctx, "driver_1", "p", true, "the bank says it paid"))
	_, err := b.runner.Run(b.ctx, wf, payoutRequest("p"))
	require.NoError(t, err)
	got := events(t, b, "p")
	require.Equal(t, [][3]string{
		{"unknown", "running", "unknown"},
		{"resumed", "unknown", "running"},
		{"parked", "running", "parked"},
		{"resolved", "parked", "unknown"},
		{"resumed", "unknown", "running"},
		{"finished", "running", "finished"},
	}, got)
	require.Len(t, bk.payouts, 1)

	require.ErrorIs(t, b.runner.Forget(b.ctx, "driver_1", "p"), atomicphase.ErrKeyPaid, "it paid")
	require.NoError(t, b.runner.ForgetForced(b.ctx, "driver_1", "p", "ops", "the bank refunded po_1"))
	require.Empty(t, events(t, b, "p"), "forgotten with its key")
	require.Zero(t, historyRows(t, b))
}

// A process dies holding a key; its lease runs out; a retry takes it over.
func TestKeyHistoryOfATakeover(t *testing.T) {
	t.Parallel()
	var crash atomic.Bool
	b := setup(t, &atomicphase.Config{CallGrace: time.Nanosecond,
		FaultInjector: atomicphase.FaultInjectorFunc(func(_ context.Context, at atomicphase.FaultPoint, _ *pgx.Conn) error {
			if at.Phase == "pay" && at.Place == atomicphase.BeforePhase && crash.Swap(false) {
				return fmt.Errorf("killed: %w", atomicphase.ErrCrashed)
			}
			return nil
		})})
	bk := newBank()
	wf := payoutWorkflow(bk)
	crash.Store(true)
	_, err := b.runner.Run(b.ctx, wf, payoutRequest("k"))
	require.ErrorIs(t, err, atomicphase.ErrCrashed)
	require.Empty(t, events(t, b, "k"), "a key held by a live-looking attempt has no history yet")
	require.NoError(t, atomicphasetest.AgeLocks(b.ctx, b.db.Pool, time.Hour))
	_, err = b.runner.Run(b.ctx, wf, payoutRequest("k"))
	require.NoError(t, err)
	require.Equal(t, [][3]string{
		{"taken_over", "running", "running"},
		{"finished", "running", "finished"},
	}, events(t, b, "k"))
}

// On a schema before migration 019, KeyHistory says the schema is missing
// what it needs.
func TestKeyHistoryNeedsItsMigration(t *testing.T) {
	t.Parallel()
	b := setupDB(t, unmigratedDBOpts, nil)
	_, err := atomicphase.Migrate(b.ctx, b.db.Pool, &atomicphase.MigrateOpts{TargetVersion: 16})
	require.NoError(t, err)
	_, err = b.runner.KeyHistory(b.ctx, "s", "k", 0)
	require.ErrorIs(t, err, atomicphase.ErrSchemaMissing)
}

// A key retried without end keeps its newest 1000 events.
func TestKeyHistoryIsBounded(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := b.db.Pool.Exec(b.ctx, sql, args...)
		require.NoError(t, err)
	}
	exec(`INSERT INTO idempotency_keys (scope, idempotency_key, workflow, fingerprint, request_method, request_path, state, locked_at, attempts, lock_token, status)
		VALUES ('driver_1', 'k', 'w', '\x00', 'POST', '/', '\x00', now(), 100, 7, 'r')`)
	exec(`INSERT INTO atomicphase_key_history (scope, idempotency_key, event, status_before, status, recovery_point, attempt, lock_token)
		SELECT 'driver_1', 'k', 'failed', 'running', 'waiting', 'started', i, 1 FROM generate_series(1, 1200) i`)
	exec(`SELECT atomicphase_release('driver_1', 'k', 7, 'down', 0, false, false, false, false)`)
	require.Equal(t, 1000, historyRows(t, b))
	h, err := b.runner.KeyHistory(b.ctx, "driver_1", "k", 0)
	require.NoError(t, err)
	require.Len(t, h, atomicphase.DefaultHistoryLimit)
	require.Equal(t, 100, h[len(h)-1].Attempt, "the newest are shown")
	require.Equal(t, "down", *h[len(h)-1].Error)
}

// The functions that write a key's history write the key table's schema's,
// whatever the writing session's search_path holds: a schema named after
// the role, holding a table by the history's name, takes nothing from
// them.
func TestKeyHistoryIsWrittenInTheKeyTablesSchema(t *testing.T) {
	t.Parallel()
	atomicphasetest.SkipOnCitus(t, "a schema per role is a single node's matter here")
	b := setup(t, nil)
	var user string
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT current_user`).Scan(&user))
	own := pgx.Identifier{user, "atomicphase_key_history"}.Sanitize()
	for _, sql := range []string{`CREATE SCHEMA ` + pgx.Identifier{user}.Sanitize(),
		`CREATE TABLE ` + own + ` (LIKE atomicphase_key_history INCLUDING ALL)`} {
		_, err := b.db.Pool.Exec(b.ctx, sql)
		require.NoError(t, err)
	}
	bk := newBank()
	var faults modelFaults
	faults.set("", false)
	faults.transient.Store(true)
	_, err := b.runner.Run(b.ctx, modelWorkflow(bk, &faults), payoutRequest("k"))
	require.Error(t, err)
	var stray int
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM `+own).Scan(&stray))
	require.Zero(t, stray, "an event went astray")
	var schema string
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT relnamespace::regnamespace::text FROM pg_class WHERE oid = 'idempotency_keys'::regclass`).Scan(&schema))
	rows, err := b.db.Pool.Query(b.ctx, `SELECT event FROM `+schema+`.atomicphase_key_history WHERE idempotency_key = 'k'`)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"failed"}, got)
}

// A verdict taken into a key a stale attempt held keeps the key running
// and goes in its history; the key's finish after it does too, and a
// delete takes the history along.
func TestKeyHistoryGoesWithAKeyMarkedOnlyOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	for _, sql := range []string{
		`INSERT INTO idempotency_keys (scope, idempotency_key, workflow, fingerprint, request_method, request_path, state, locked_at, lease_us, unknown_at, lock_token, status)
			VALUES ('driver_1', 'k', 'w', '\x00', 'POST', '/', '\x00', now() - interval '1 hour', 1000000, now(), 7, 'r')`,
		`SELECT * FROM atomicphase_record_verdict('driver_1', 'k', true, 'checked', 1000000, NULL)`,
		`SELECT atomicphase_checkpoint('driver_1', 'k', 7, 'finished', NULL, '\x00', 201, NULL, '')`,
	} {
		_, err := b.db.Pool.Exec(b.ctx, sql)
		require.NoError(t, err, sql)
	}
	require.Equal(t, [][3]string{{"resolved", "running", "running"}, {"finished", "running", "finished"}}, events(t, b, "k"))
	_, err := b.db.Pool.Exec(b.ctx, `DELETE FROM idempotency_keys WHERE idempotency_key = 'k'`)
	require.NoError(t, err)
	require.Zero(t, historyRows(t, b), "no history outlives its key")
}
