package atomicphase_test

import (
	"context"
	"errors"
	"regexp"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

// finishWrites are the key row's columns a finish changes on a key that
// never went wrong (atomicphase_checkpoint with a response). An index that
// reads any of them, as a key, an expression or a predicate, makes every
// finish write a new entry in it: no longer a HOT update.
// (next_attempt_at, also written, stays NULL on such a key.)
var finishWrites = []string{"recovery_point", "next_phase", "state", "locked_at", "response_status",
	"response_header", "response_body", "finished_at", "unknown_at", "call_until", "updated_at", "status"}

// A request that succeeds first time writes two index entries in all (the
// key's primary key and its creation time), and its finish changes no
// column an index reads, so PostgreSQL can keep it on the row's page
// without touching an index (a HOT update).
func TestFreshRequestWritesTwoIndexEntriesAndFinishesHOT(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var c counters
	resp, err := b.runner.Run(b.ctx, orderWorkflow(t, &c, hooks{}), orderRequest("u", "k"))
	require.NoError(t, err)
	require.Equal(t, 201, resp.Status)

	rows, err := b.db.Pool.Query(b.ctx, `
		SELECT c.relname, pg_get_indexdef(i.indexrelid), coalesce(pg_get_expr(i.indpred, i.indrelid), '')
		FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
		WHERE i.indrelid = 'idempotency_keys'::regclass ORDER BY c.relname`)
	require.NoError(t, err)
	type index struct{ name, def, pred string }
	var indexes []index
	for rows.Next() {
		var ix index
		require.NoError(t, rows.Scan(&ix.name, &ix.def, &ix.pred))
		indexes = append(indexes, ix)
	}
	require.NoError(t, rows.Err())

	var entries []string
	for _, ix := range indexes {
		for _, col := range finishWrites {
			require.NotRegexp(t, regexp.MustCompile(`\b`+col+`\b`), ix.def,
				"index %s reads %s, which a finish writes: the finish would not be a HOT update", ix.name, col)
		}
		holds := true
		if ix.pred != "" {
			require.NoError(t, b.db.Pool.QueryRow(b.ctx,
				`SELECT EXISTS (SELECT FROM idempotency_keys WHERE scope = 'u' AND idempotency_key = 'k' AND (`+ix.pred+`))`).Scan(&holds))
		}
		if holds {
			entries = append(entries, ix.name)
		}
	}
	require.ElementsMatch(t, []string{"idempotency_keys_pkey", "idempotency_keys_created_at_idx"}, entries,
		"the finished key has an entry in these indexes only")
	require.Len(t, indexes, 4, "the key table's indexes: the primary key, creation time, keys that went wrong, parked keys")
	require.Zero(t, historyRows(t, b), "nor a row, nor an index entry, in the key's history")
	var status string
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT status::text FROM idempotency_keys WHERE scope = 'u' AND idempotency_key = 'k'`).Scan(&status))
	require.Equal(t, "f", status, "its state is stored, finished")
}

// A key that never went wrong carries no mark, and its process may die
// without a word: the sweep finds it once its watermark, one lock timeout
// behind the present, passes the key's creation, and finishes it. A
// finished key it passes stays unmarked.
func TestSweepFindsADeadKeyAsItsWatermarkPasses(t *testing.T) {
	t.Parallel()
	const lockTimeout = 200 * time.Millisecond
	b := setup(t, &atomicphase.Config{LockTimeout: lockTimeout, FaultInjector: crashOnce("charge", atomicphase.AfterForeign)})
	var c counters
	wf := orderWorkflow(t, &c, hooks{})
	_, err := b.runner.Run(b.ctx, wf, orderRequest("u", "dead"))
	require.ErrorIs(t, err, atomicphase.ErrCrashed)
	_, err = b.runner.Run(b.ctx, wf, orderRequest("u", "done"))
	require.NoError(t, err)
	info, err := b.runner.Inspect(b.ctx, "u", "dead")
	require.NoError(t, err)
	require.Nil(t, info.NextAttemptAt, "the key never went wrong as far as the table knows")
	var before time.Time
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT created_before FROM atomicphase_sweep_watermark`).Scan(&before))

	s := newSweeper(t, b, nil)
	require.Eventually(t, func() bool {
		res, err := s.RunOnce(b.ctx)
		require.NoError(t, err)
		return res.Completed == 1
	}, time.Minute, 20*time.Millisecond, "the sweep finishes the dead key")
	require.EqualValues(t, 2, c.create.Load(), "each key's committed phase ran once")
	info, err = b.runner.Inspect(b.ctx, "u", "dead")
	require.NoError(t, err)
	require.Equal(t, atomicphase.KeyFinished, info.Status)
	require.Nil(t, info.NextAttemptAt, "the finish clears the mark")
	info, err = b.runner.Inspect(b.ctx, "u", "done")
	require.NoError(t, err)
	require.Nil(t, info.NextAttemptAt, "a finished key is never marked")
	var after, created time.Time
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT created_before FROM atomicphase_sweep_watermark`).Scan(&after))
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT created_at FROM idempotency_keys WHERE idempotency_key = 'dead'`).Scan(&created))
	require.True(t, after.After(before) && after.After(created), "the watermark moved past the key")
}

// The per-scope cap counts with an index of its own, which the default
// schema leaves out (every finish would write an entry in it): a Runner
// with a cap refuses to start without it, and MigrateOpts.ScopeCap builds
// it, after which the count reads it.
func TestScopeCapNeedsItsIndex(t *testing.T) {
	t.Parallel()
	b := setup(t, &atomicphase.Config{MaxUnfinishedPerScope: 3})
	err := b.runner.CheckSchema(b.ctx)
	require.ErrorIs(t, err, atomicphase.ErrSchemaMissing)
	require.ErrorContains(t, err, "idempotency_keys_unfinished_idx")
	require.ErrorContains(t, err, "MigrateOpts.ScopeCap")

	uncapped, err := atomicphase.NewRunner(b.db.Pool, nil)
	require.NoError(t, err)
	require.NoError(t, uncapped.CheckSchema(b.ctx), "a Runner without a cap needs no such index")

	applied, err := atomicphase.Migrate(b.ctx, b.db.Pool, &atomicphase.MigrateOpts{ScopeCap: true})
	require.NoError(t, err)
	require.Empty(t, applied)
	require.NoError(t, b.runner.CheckSchema(b.ctx))
	_, err = atomicphase.Migrate(b.ctx, b.db.Pool, &atomicphase.MigrateOpts{ScopeCap: true})
	require.NoError(t, err, "building it again is a no-op")

	_, err = b.db.Pool.Exec(b.ctx, `
		INSERT INTO idempotency_keys (scope, idempotency_key, workflow, fingerprint, request_method, request_path, state,
		                              recovery_point, response_status, finished_at, status)
		SELECT 's' || (i % 50), 'k' || i, 'w', '\x00', 'POST', '/', '{}', 'finished', 200, now(), 'f' FROM generate_series(1, 20000) i;
		ANALYZE idempotency_keys`)
	require.NoError(t, err)
	var plan string
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `EXPLAIN (FORMAT JSON)
		SELECT count(*) FROM (SELECT 1 FROM idempotency_keys u
		                      WHERE u.scope = 's1' AND u.response_status IS NULL AND u.parked_at IS NULL LIMIT 3) AS capped`).Scan(&plan))
	require.Contains(t, plan, "idempotency_keys_unfinished_idx", "the cap's count reads its index, not the scope's finished keys")
}

// An upgrade in two steps: to MinVersion while the previous release
// serves (its indexes stay, and this release's Runner starts), then, when
// asked, the contract step, which drops what only the previous release
// read; Migrate with no options leaves it.
func TestMigrateToMinVersionThenContract(t *testing.T) {
	t.Parallel()
	b := setupDB(t, unmigratedDBOpts, nil)
	applied, err := atomicphase.Migrate(b.ctx, b.db.Pool, &atomicphase.MigrateOpts{TargetVersion: atomicphase.MinVersion})
	require.NoError(t, err)
	require.Equal(t, atomicphase.MinVersion, applied[len(applied)-1])
	require.NoError(t, b.runner.CheckSchema(b.ctx), "this release runs on MinVersion")
	indexExists := func(name string) bool {
		var ok bool
		require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT to_regclass($1) IS NOT NULL`, name).Scan(&ok))
		return ok
	}
	require.True(t, indexExists("idempotency_keys_due_idx"), "the previous release's sweep still reads its index")
	var c counters
	_, err = b.runner.Run(b.ctx, orderWorkflow(t, &c, hooks{}), orderRequest("u", "k"))
	require.NoError(t, err)

	// At start-up, with no options: nothing more, the contract step is left
	// for when it is asked for.
	applied, err = atomicphase.Migrate(b.ctx, b.db.Pool, nil)
	require.NoError(t, err)
	require.Empty(t, applied)
	pending, err := atomicphase.PendingMigrations(b.ctx, b.db.Pool, nil)
	require.NoError(t, err)
	require.Len(t, pending, 1)
	require.True(t, pending[0].Contract)
	require.Equal(t, atomicphase.MinVersion+1, pending[0].Version)
	require.True(t, indexExists("idempotency_keys_due_idx"))

	applied, err = atomicphase.Migrate(b.ctx, b.db.Pool, &atomicphase.MigrateOpts{Contract: true})
	require.NoError(t, err)
	require.Equal(t, []int{atomicphase.MinVersion + 1}, applied)
	require.False(t, indexExists("idempotency_keys_due_idx"))
	pending, err = atomicphase.PendingMigrations(b.ctx, b.db.Pool, nil)
	require.NoError(t, err)
	require.Empty(t, pending)
	require.NoError(t, b.runner.CheckSchema(b.ctx))

	_, err = atomicphase.Migrate(b.ctx, b.db.Pool, &atomicphase.MigrateOpts{TargetVersion: 99})
	require.ErrorContains(t, err, "MigrateOpts.TargetVersion is 99")
}

// An upgrade carries keys in every state: made on the schema of the
// previous release (migration 015), through the functions that release
// writes keys with (its admission, checkpoint and release: what its code
// sends for each, with the bank's payouts as its calls made them), then
// migrated, they are found and finished by the sweep (a crashed one, one
// waiting out its backoff, one whose payout's outcome was unknown), the
// parked one stays parked and unsettled, the finished one replays, the
// console counts every unfinished one, and the bank pays each request
// once.
func TestUpgradeCarriesKeysInEveryState(t *testing.T) {
	t.Parallel()
	var faults modelFaults
	faults.set("", false)
	b := setupDB(t, unmigratedDBOpts, &atomicphase.Config{CallGrace: time.Nanosecond, MaxAttempts: 5})
	_, err := atomicphase.Migrate(b.ctx, b.db.Pool, &atomicphase.MigrateOpts{TargetVersion: 15})
	require.NoError(t, err)
	bk := newBank()
	wf := modelWorkflow(bk, &faults)
	fp, err := atomicphase.FingerprintOf("POST", "/payouts", nil)
	require.NoError(t, err)
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := b.db.Pool.Exec(b.ctx, sql, args...)
		require.NoError(t, err, sql)
	}
	// The previous release's admission of a new key, which records it
	// locked under token; and its payout at the bank, under the pay
	// phase's downstream key, for the keys whose call went out.
	admit := func(key string, token int64) {
		var acquired bool
		require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT acquired FROM atomicphase_admit('driver_1', $1, 'model', $2, 'POST', '/payouts',
			'{}', 30000000, $3, NULL, $4)`, key, fp[:], token, wf.Version()).Scan(&acquired))
		require.True(t, acquired, key)
	}
	paid := func(key string) {
		var salt string
		require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT downstream_salt::text FROM idempotency_keys WHERE idempotency_key = $1`, key).Scan(&salt))
		ref := atomicphase.DownstreamKeyOf(salt, "model", "driver_1", key, "pay")
		bk.mu.Lock()
		bk.payouts[ref] = []string{"po_1"}
		bk.mu.Unlock()
	}
	checkpoint := `SELECT atomicphase_checkpoint('driver_1', $1, $2, $3, NULL, $4, $5, NULL, $6)`
	release := `SELECT atomicphase_release('driver_1', $1, $2, $3, $4, $5, $6, $7, $8)`
	const payoutState = `{"payout_id":"po_1"}`

	admit("finished", 1)
	exec(checkpoint, "finished", int64(1), "prepare", []byte(`{}`), nil, nil)
	paid("finished")
	exec(checkpoint, "finished", int64(1), "finished", []byte(payoutState), 201, []byte("paid"))
	// Killed right after its payout went out.
	admit("running", 2)
	exec(checkpoint, "running", int64(2), "prepare", []byte(`{}`), nil, nil)
	paid("running")
	// A passing fault in prepare: waiting for its backoff.
	admit("waiting", 3)
	exec(release, "waiting", int64(3), `phase "prepare": a passing fault in prepare`, int64(time.Second/time.Microsecond), false, false, false, false)
	// The payout's answer lost.
	admit("unknown", 4)
	exec(checkpoint, "unknown", int64(4), "prepare", []byte(`{}`), nil, nil)
	paid("unknown")
	exec(release, "unknown", int64(4), `phase "pay": atomicphase: outcome of a foreign call unknown`, int64(time.Second/time.Microsecond), false, true, false, true)
	// Paid, then parked for good by a bug in done.
	admit("parked", 5)
	exec(checkpoint, "parked", int64(5), "prepare", []byte(`{}`), nil, nil)
	paid("parked")
	exec(checkpoint, "parked", int64(5), "pay", []byte(payoutState), nil, nil)
	exec(release, "parked", int64(5), `phase "done": a bug in done`, nil, true, false, true, true)

	// The keys are an hour old when the upgrade comes (leases, backoffs
	// and the call's grace are over).
	shiftTimes(t, b, time.Hour, false)
	_, err = atomicphase.Migrate(b.ctx, b.db.Pool, nil)
	require.NoError(t, err)
	require.NoError(t, b.runner.CheckSchema(b.ctx))
	want := map[string]atomicphase.KeyStatus{"finished": atomicphase.KeyFinished, "running": atomicphase.KeyStale,
		"waiting": atomicphase.KeyAbandoned, "unknown": atomicphase.KeyUnknown, "parked": atomicphase.KeyParked}
	for key, status := range want {
		info, err := b.runner.Inspect(b.ctx, "driver_1", key)
		require.NoError(t, err)
		require.Equal(t, status, info.Status, "%s: its state stored by the migration", key)
	}
	levels, err := b.runner.KeyLevels(b.ctx, nil)
	require.NoError(t, err)
	var unfinished int64
	for _, l := range levels {
		unfinished += l.Count
	}
	require.EqualValues(t, 4, unfinished, "the console counts every unfinished key: %+v", levels)

	require.NoError(t, b.runner.Register(wf))
	s := newSweeper(t, b, nil)
	for range 3 {
		_, err := s.RunOnce(b.ctx)
		require.NoError(t, err)
	}
	for _, key := range []string{"running", "waiting", "unknown", "finished"} {
		info, err := b.runner.Inspect(b.ctx, "driver_1", key)
		require.NoError(t, err)
		require.Equal(t, atomicphase.KeyFinished, info.Status, key)
		require.Nil(t, info.NextAttemptAt, "%s: finished, the mark is gone", key)
		resp, err := b.runner.Run(b.ctx, wf, payoutRequest(key))
		require.NoError(t, err)
		require.Equal(t, []byte("paid"), resp.Body, "%s replays", key)
	}
	info, err := b.runner.Inspect(b.ctx, "driver_1", "parked")
	require.NoError(t, err)
	require.Equal(t, atomicphase.KeyParked, info.Status)
	require.True(t, info.Unsettled, "it paid before its bug parked it")
	require.ErrorIs(t, b.runner.Forget(b.ctx, "driver_1", "parked"), atomicphase.ErrOutcomeUnsettled)

	// Migration 017 came with the upgrade: the keys made before it have
	// their state stored, and the history of what the sweep did with them
	// since; nothing deletes the parked one by hand.
	for key, want := range map[string]struct {
		state   string
		history [][3]string
	}{
		"running":  {"finished", [][3]string{{"taken_over", "running", "running"}, {"finished", "running", "finished"}}},
		"waiting":  {"finished", [][3]string{{"resumed", "waiting", "running"}, {"finished", "running", "finished"}}},
		"unknown":  {"finished", [][3]string{{"resumed", "unknown", "running"}, {"finished", "running", "finished"}}},
		"finished": {"finished", [][3]string{}},
		"parked":   {"parked", [][3]string{}},
	} {
		var state string
		require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT `+storedState+` FROM idempotency_keys WHERE scope = 'driver_1' AND idempotency_key = $1`, key).Scan(&state))
		require.Equal(t, want.state, state, key)
		require.Equal(t, want.history, events(t, b, key), key)
	}
	_, err = b.db.Pool.Exec(b.ctx, `DELETE FROM idempotency_keys WHERE idempotency_key = 'parked'`)
	require.Equal(t, "AP011", sqlState(err), "%v", err)
	bk.mu.Lock()
	defer bk.mu.Unlock()
	require.Len(t, bk.payouts, 5, "one reference per request")
	for ref, ids := range bk.payouts {
		require.Len(t, ids, 1, "paid once under %s", ref)
	}
}

// A key's row is stamped before its transaction commits, and a commit can
// wait (here on a deferred constraint another transaction holds): the
// watermark must not pass a key that shows up after its time, or the
// sweep never finds it once its process dies. It waits for the
// transactions in progress when it planned its move.
func TestWatermarkWaitsForAKeyCommittedLate(t *testing.T) {
	t.Parallel()
	const lockTimeout = 200 * time.Millisecond
	b := setup(t, &atomicphase.Config{LockTimeout: lockTimeout, FaultInjector: crashOnce("charge", atomicphase.AfterForeign)})
	_, err := b.db.Pool.Exec(b.ctx, `CREATE TABLE held (v int UNIQUE DEFERRABLE INITIALLY DEFERRED)`)
	require.NoError(t, err)
	other, err := b.db.Pool.Begin(b.ctx)
	require.NoError(t, err)
	defer other.Rollback(b.ctx) //nolint:errcheck // a no-op once rolled back
	_, err = other.Exec(b.ctx, `INSERT INTO held VALUES (1)`)
	require.NoError(t, err)

	var c counters
	wf := orderWorkflow(t, &c, hooks{afterCreate: func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO held VALUES (1)`)
		return err
	}})
	done := make(chan error, 1)
	go func() {
		_, err := b.runner.Run(b.ctx, wf, orderRequest("u", "late"))
		done <- err
	}()
	var waitingSince time.Time
	require.Eventually(t, func() bool {
		err := b.db.Pool.QueryRow(b.ctx, `SELECT now() FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()`).
			Scan(&waitingSince)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			t.Log(err)
		}
		return err == nil
	}, time.Minute, 5*time.Millisecond, "the first unit's commit waits")

	// The sweep runs until a watermark one lock timeout behind the present
	// would be past the moment the commit began to wait, which is after
	// the key's row was stamped.
	s := newSweeper(t, b, nil)
	require.Eventually(t, func() bool {
		_, err := s.RunOnce(b.ctx)
		require.NoError(t, err)
		var later bool
		require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT now() - $2::bigint * interval '1 microsecond' > $1::timestamptz`,
			waitingSince, 2*lockTimeout.Microseconds()).Scan(&later))
		return later
	}, time.Minute, 20*time.Millisecond)
	for range 2 {
		_, err = s.RunOnce(b.ctx)
		require.NoError(t, err)
	}
	var passed time.Time
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT created_before FROM atomicphase_sweep_watermark`).Scan(&passed))
	require.True(t, passed.Before(waitingSince), "the watermark waits for the transaction in progress")

	require.NoError(t, other.Rollback(b.ctx))
	require.ErrorIs(t, <-done, atomicphase.ErrCrashed, "the key commits, then its process dies after its call")
	require.Eventually(t, func() bool {
		res, err := s.RunOnce(b.ctx)
		require.NoError(t, err)
		return res.Completed == 1
	}, time.Minute, 20*time.Millisecond, "the sweep finds the key and finishes it")
	require.EqualValues(t, 1, c.create.Load())
}
