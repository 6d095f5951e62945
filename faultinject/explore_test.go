package faultinject_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
	"github.com/atomicphase/atomicphase/faultinject"
)

func TestExploreEveryPointAndAction(t *testing.T) {
	t.Parallel()
	sc := shopScenario(sound)
	if testing.Verbose() {
		sc.Out = os.Stdout
	}
	rep := faultinject.Explore(t, sc)

	// 13 points: 2 around acquisition, 3 per local phase plus the
	// response point of the last, 4 for the foreign phase.
	require.Len(t, uniq(rep.Points), 13)
	runs := map[faultinject.Action]int{}
	for _, row := range rep.Rows[1:] {
		runs[row.Faults[0].Action]++
		require.Equal(t, "201", row.Outcome)
	}
	require.Equal(t, 13, runs[faultinject.Crash])
	require.Equal(t, 13, runs[faultinject.Error])
	require.Equal(t, 13, runs[faultinject.Panic])
	require.Equal(t, 13, runs[faultinject.Delay])
	require.Equal(t, 9, runs[faultinject.TerminateBackend], "every point where a connection is held")
	require.Equal(t, 3, runs[faultinject.LoseCommitAck], "every commit")
}

func TestExploreRandomConsecutiveFaults(t *testing.T) {
	t.Parallel()
	rep := faultinject.ExploreRandom(t, shopScenario(sound), 20261122, 25)
	retriedUnderFault := 0
	for _, row := range rep.Rows[1:] {
		require.Equal(t, "201", row.Outcome)
		if len(row.Faults) > 1 && row.Attempts > 1 {
			retriedUnderFault++
		}
	}
	require.Positive(t, retriedUnderFault, "some runs fault the retries too")
}

func TestExplorerCatchesBrokenWorkflows(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		flaw   flaw
		broken string // the invariant that must be reported
	}{
		{"fresh downstream key on every attempt", randomKey, "distinct charges at the downstream"},
		{"foreign call outside the guard", outsideGuard, "distinct charges at the downstream"},
		{"business write outside the phase transaction", outsideTx, "order rows"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			rep := faultinject.Survey(t, shopScenario(c.flaw))
			v := rep.Violation()
			require.NotNil(t, v, "the explorer must catch this workflow:\n%s", rep)
			require.ErrorContains(t, v.Violation, c.broken)
			require.NotEmpty(t, v.Faults, "the report names the point and action that broke it")
			require.Contains(t, rep.String(), "VIOLATED")
			t.Logf("caught at %v: %v", v.Faults, v.Violation)
		})
	}
}

// TestLoseCommitAckDoesNotRepeatThePhase: the COMMIT lands but its answer
// is lost; the retry sees the advanced recovery point and runs the phase no
// second time.
func TestLoseCommitAckDoesNotRepeatThePhase(t *testing.T) {
	t.Parallel()
	opts := *shopDB
	opts.PoolConfig = func(cfg *pgxpool.Config) { faultinject.InstallDialer(cfg.ConnConfig) }
	db := atomicphasetest.NewDB(t, &opts)
	down := newDownstream(t)
	defer down.Close()
	inj := faultinject.New(faultinject.Rule{Phase: "create_order", Place: atomicphase.BeforeCommit, Action: faultinject.LoseCommitAck})
	runner, err := atomicphase.NewRunner(db.Pool, &atomicphase.Config{FaultInjector: inj})
	require.NoError(t, err)
	wf := shopWorkflow(down.URL, db.Pool, sound)
	ctx := context.Background()

	_, err = runner.Run(ctx, wf, shopRequest())
	var pe *atomicphase.PhaseError
	require.ErrorAs(t, err, &pe, "the client saw a broken connection")
	require.Equal(t, "create_order", pe.Phase)
	info, err := runner.Inspect(ctx, "customer_1", "order-123")
	require.NoError(t, err)
	require.Equal(t, "create_order", info.RecoveryPoint, "the COMMIT reached the server")
	require.False(t, info.Locked)

	resp, err := runner.Run(ctx, wf, shopRequest())
	require.NoError(t, err)
	require.Equal(t, 201, resp.Status)
	creates := 0
	for _, p := range inj.Passed() {
		if p.Point.Phase == "create_order" && p.Point.Place == atomicphase.BeforePhase {
			creates++
		}
	}
	require.Equal(t, 1, creates, "the retry did not run create_order again")
	require.NoError(t, checkShop(ctx, db.Pool, down, resp.Body))
}

func TestTerminateBackendBreaksTheConnection(t *testing.T) {
	t.Parallel()
	db := atomicphasetest.NewDB(t, shopDB)
	down := newDownstream(t)
	defer down.Close()
	inj := faultinject.New(faultinject.Rule{Phase: "confirm", Place: atomicphase.BeforeCommit, Action: faultinject.TerminateBackend})
	inj.Admin = db.Pool
	runner, err := atomicphase.NewRunner(db.Pool, &atomicphase.Config{FaultInjector: inj})
	require.NoError(t, err)
	ctx := context.Background()
	_, err = runner.Run(ctx, shopWorkflow(down.URL, db.Pool, sound), shopRequest())
	require.Error(t, err)
	require.Contains(t, strings.ToLower(err.Error()), "terminat", "the driver met the terminated backend: %v", err)
	var count int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM orders WHERE charge_id IS NOT NULL`).Scan(&count))
	require.Zero(t, count, "confirm's write rolled back with its backend")
}

func TestCrashLeavesTheKeyLocked(t *testing.T) {
	t.Parallel()
	db := atomicphasetest.NewDB(t, shopDB)
	down := newDownstream(t)
	defer down.Close()
	inj := faultinject.New(faultinject.Rule{Phase: "confirm", Place: atomicphase.BeforeCommit, Action: faultinject.Crash})
	runner, err := atomicphase.NewRunner(db.Pool, &atomicphase.Config{FaultInjector: inj})
	require.NoError(t, err)
	ctx := context.Background()
	wf := shopWorkflow(down.URL, db.Pool, sound)
	_, err = runner.Run(ctx, wf, shopRequest())
	require.ErrorIs(t, err, atomicphase.ErrCrashed)

	_, err = runner.Run(ctx, wf, shopRequest())
	require.ErrorIs(t, err, atomicphase.ErrInProgress, "the dead attempt still holds the key")
	require.NoError(t, faultinject.AgeLocks(ctx, db.Pool, atomicphase.DefaultLockTimeout))
	resp, err := runner.Run(ctx, wf, shopRequest())
	require.NoError(t, err)
	require.Equal(t, 201, resp.Status)
	require.NoError(t, checkShop(ctx, db.Pool, down, resp.Body))
}

func TestInjectorRulesFireOnceAndMatchWildcards(t *testing.T) {
	t.Parallel()
	inj := faultinject.New(
		faultinject.Rule{Place: atomicphase.BeforeCommit, Action: faultinject.Error, Times: 2},
		faultinject.Rule{Workflow: "other", Place: atomicphase.AfterCommit, Action: faultinject.Error},
	)
	ctx := context.Background()
	at := atomicphase.FaultPoint{Workflow: "shop", Phase: "x", Place: atomicphase.BeforeCommit}
	require.ErrorIs(t, inj.InjectFault(ctx, at, nil), faultinject.ErrInjected)
	require.ErrorIs(t, inj.InjectFault(ctx, at, nil), faultinject.ErrInjected)
	require.NoError(t, inj.InjectFault(ctx, at, nil), "Times: 2 fires twice")
	require.NoError(t, inj.InjectFault(ctx, atomicphase.FaultPoint{Workflow: "shop", Place: atomicphase.AfterCommit}, nil))
	require.Equal(t, []int{2, 0}, inj.Fired())
	require.Len(t, inj.Passed(), 4)

	var nilInj *faultinject.Injector
	require.NoError(t, nilInj.InjectFault(ctx, at, nil), "a nil injector injects nothing")
	require.True(t, errors.Is(faultinject.New(faultinject.Rule{Place: atomicphase.BeforeCommit, Action: faultinject.Crash}).
		InjectFault(ctx, at, nil), atomicphase.ErrCrashed))
}

func uniq(ps []faultinject.Passed) map[atomicphase.FaultPoint]bool {
	m := map[atomicphase.FaultPoint]bool{}
	for _, p := range ps {
		m[p.Point] = true
	}
	return m
}
