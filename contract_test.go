package atomicphase_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

// previousAnnounceSQL is how release 0.2.0 records that a process runs a
// workflow version, word for word: it sets seen_at alone.
const previousAnnounceSQL = `
INSERT INTO atomicphase_workflow_versions AS v (workflow, version, shape, phases)
VALUES ($1::text, $2::text, $3::text, $4::text[])
ON CONFLICT (workflow, version) DO UPDATE SET seen_at = now(), phases = EXCLUDED.phases
    WHERE v.shape = EXCLUDED.shape
RETURNING true`

// The contract step waits for the previous release: Migrate with no
// options, as a service calls it at start-up, applies the expand steps
// and leaves the contract step; asked for it, Migrate refuses, changing
// nothing, while a process of 0.2.0 (which records no release) has
// announced its versions within MigrateOpts.LiveWithin, before this
// release's processes announce the same version and after; once none has
// been seen within it, the step is applied.
func TestTheContractStepWaitsForAnOlderRelease(t *testing.T) {
	t.Parallel()
	b := setupDB(t, unmigratedDBOpts, nil)
	_, err := atomicphase.Migrate(b.ctx, b.db.Pool, &atomicphase.MigrateOpts{TargetVersion: 15})
	require.NoError(t, err)
	var c counters
	wf := orderWorkflow(t, &c, hooks{})
	previous := func() {
		t.Helper()
		var ok bool
		require.NoError(t, b.db.Pool.QueryRow(b.ctx, previousAnnounceSQL, wf.Name(), wf.Version(), atomicphase.ShapeOf(wf), []string{"a"}).Scan(&ok))
	}
	previous() // a 0.2.0 process serves

	applied, err := atomicphase.Migrate(b.ctx, b.db.Pool, nil) // this release's start-up
	require.NoError(t, err)
	require.Equal(t, []int{16, 17, 18, 19}, applied)
	require.NoError(t, b.runner.Register(wf))
	require.NoError(t, b.runner.RecordVersions(b.ctx))
	_, err = b.runner.Run(b.ctx, wf, orderRequest("u", "k"))
	require.NoError(t, err)

	indexExists := func() bool {
		var ok bool
		require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT to_regclass('idempotency_keys_due_idx') IS NOT NULL`).Scan(&ok))
		return ok
	}
	contract := func(opts *atomicphase.MigrateOpts) error {
		t.Helper()
		applied, err := atomicphase.Migrate(b.ctx, b.db.Pool, opts)
		if err != nil {
			require.Empty(t, applied)
			require.True(t, indexExists(), "a refused contract step changes nothing")
			pending, perr := atomicphase.PendingMigrations(b.ctx, b.db.Pool, nil)
			require.NoError(t, perr)
			require.Len(t, pending, 1)
		}
		return err
	}
	err = contract(&atomicphase.MigrateOpts{Contract: true})
	require.ErrorIs(t, err, atomicphase.ErrOlderReleaseLive, "0.2.0's announcement from before the upgrade")
	require.ErrorContains(t, err, "migration 020_drop_request_indexes")

	previous() // 0.2.0 again, after this release announced the same version
	require.NoError(t, b.runner.RecordVersions(b.ctx))
	require.ErrorIs(t, contract(&atomicphase.MigrateOpts{Contract: true}), atomicphase.ErrOlderReleaseLive,
		"this release's announcement keeps the trace of 0.2.0's")
	previous()
	require.ErrorIs(t, contract(&atomicphase.MigrateOpts{Contract: true, LiveWithin: time.Hour}), atomicphase.ErrOlderReleaseLive)

	// Seen longer ago than LiveWithin: the step is applied.
	_, err = b.db.Pool.Exec(b.ctx, `UPDATE atomicphase_workflow_versions SET seen_at = seen_at - interval '2 hours',
		current_seen_at = current_seen_at - interval '2 hours', older_seen_at = older_seen_at - interval '2 hours'`)
	require.NoError(t, err)
	require.NoError(t, b.runner.RecordVersions(b.ctx)) // this release is live: that is no reason to wait
	applied, err = atomicphase.Migrate(b.ctx, b.db.Pool, &atomicphase.MigrateOpts{Contract: true, LiveWithin: time.Hour})
	require.NoError(t, err)
	require.Equal(t, []int{20}, applied)
	require.False(t, indexExists())
	_, err = b.runner.Run(b.ctx, wf, orderRequest("u", "k2"))
	require.NoError(t, err)
}

// A release that records itself in atomicphase_releases counts as older
// when it needs a migration before the one a contract step allows; this
// release's own processes do not hold up its contract step; and a
// negative LiveWithin is refused.
func TestTheContractStepReadsTheReleasesTable(t *testing.T) {
	t.Parallel()
	b := setupDB(t, unmigratedDBOpts, nil)
	_, err := atomicphase.Migrate(b.ctx, b.db.Pool, &atomicphase.MigrateOpts{TargetVersion: atomicphase.MinVersion})
	require.NoError(t, err)
	var c counters
	require.NoError(t, b.runner.Register(orderWorkflow(t, &c, hooks{})))
	require.NoError(t, b.runner.RecordVersions(b.ctx))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM atomicphase_releases WHERE needs = $1`, atomicphase.MinVersion))

	_, err = b.db.Pool.Exec(b.ctx, `INSERT INTO atomicphase_releases (needs) VALUES ($1)`, atomicphase.MinVersion-1)
	require.NoError(t, err)
	_, err = atomicphase.Migrate(b.ctx, b.db.Pool, &atomicphase.MigrateOpts{Contract: true})
	require.ErrorIs(t, err, atomicphase.ErrOlderReleaseLive)

	_, err = atomicphase.Migrate(b.ctx, b.db.Pool, &atomicphase.MigrateOpts{Contract: true, LiveWithin: -time.Second})
	require.ErrorContains(t, err, "MigrateOpts.LiveWithin is -1s")

	_, err = b.db.Pool.Exec(b.ctx, `DELETE FROM atomicphase_releases WHERE needs < $1`, atomicphase.MinVersion)
	require.NoError(t, err)
	applied, err := atomicphase.Migrate(b.ctx, b.db.Pool, &atomicphase.MigrateOpts{Contract: true})
	require.NoError(t, err)
	require.Equal(t, []int{atomicphase.MinVersion + 1}, applied)
}

// A 0.2.0 announcement whose statement took its time before this
// release's and wrote after it (seen_at earlier than current_seen_at) is
// still told apart: by difference, not by order.
func TestTheContractStepSeesAnOlderAnnouncementThatWroteLate(t *testing.T) {
	t.Parallel()
	b := setupDB(t, unmigratedDBOpts, nil)
	_, err := atomicphase.Migrate(b.ctx, b.db.Pool, &atomicphase.MigrateOpts{TargetVersion: atomicphase.MinVersion})
	require.NoError(t, err)
	var c counters
	wf := orderWorkflow(t, &c, hooks{})
	require.NoError(t, b.runner.Register(wf))
	require.NoError(t, b.runner.RecordVersions(b.ctx))

	previous, err := b.db.Pool.Begin(b.ctx)
	require.NoError(t, err)
	defer previous.Rollback(b.ctx) //nolint:errcheck // committed below
	// Its transaction's time, taken now.
	_, err = previous.Exec(b.ctx, `SELECT now()`)
	require.NoError(t, err)
	require.NoError(t, b.runner.RecordVersions(b.ctx)) // this release's, a moment later
	var ok bool
	require.NoError(t, previous.QueryRow(b.ctx, previousAnnounceSQL, wf.Name(), wf.Version(), atomicphase.ShapeOf(wf), []string{"a"}).Scan(&ok))
	require.NoError(t, previous.Commit(b.ctx))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM atomicphase_workflow_versions WHERE seen_at < current_seen_at`),
		"the older release's write carries the earlier time")

	_, err = atomicphase.Migrate(b.ctx, b.db.Pool, &atomicphase.MigrateOpts{Contract: true})
	require.ErrorIs(t, err, atomicphase.ErrOlderReleaseLive)
	require.NoError(t, b.runner.RecordVersions(b.ctx)) // and this release's next announcement keeps its trace
	_, err = atomicphase.Migrate(b.ctx, b.db.Pool, &atomicphase.MigrateOpts{Contract: true})
	require.ErrorIs(t, err, atomicphase.ErrOlderReleaseLive)
}

// Asked for by number alone, a contract step is refused: TargetVersion
// names it, Contract does not. And a database whose key table was made
// without the ledger (by a tool of its own) is no fresh one: Migrate
// applies no contract step there unasked.
func TestAContractStepIsAppliedOnlyWhenAsked(t *testing.T) {
	t.Parallel()
	b := setupDB(t, unmigratedDBOpts, nil)
	_, err := atomicphase.Migrate(b.ctx, b.db.Pool, &atomicphase.MigrateOpts{TargetVersion: atomicphase.MinVersion + 1})
	require.ErrorContains(t, err, "a contract step: set MigrateOpts.Contract")
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM pg_class WHERE relname = 'idempotency_keys'`), "nothing applied")

	// The expand steps applied, and the ledger emptied (as a tool of the
	// user's, which keeps no ledger of ours, would leave it).
	_, err = atomicphase.Migrate(b.ctx, b.db.Pool, &atomicphase.MigrateOpts{TargetVersion: atomicphase.MinVersion})
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(b.ctx, `DELETE FROM atomicphase_migration`)
	require.NoError(t, err)
	_, err = atomicphase.Migrate(b.ctx, b.db.Pool, nil)
	require.Error(t, err, "the migrations are applied already, outside the ledger")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM pg_class WHERE relname = 'idempotency_keys_due_idx'`),
		"the contract step was not applied unasked")
}
