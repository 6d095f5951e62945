package atomicphasetest_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
	"github.com/atomicphase/atomicphase/faultinject"
	"github.com/atomicphase/atomicphase/internal/testshop"
)

// payoutScenario explores one payout through a bank without idempotency
// keys, whose first call goes as first says (testshop.Bank.First), with
// the pay phase reconciled or not.
func payoutScenario(first string, reconcile bool) atomicphasetest.Scenario {
	rec := testshop.NoReconcile
	if reconcile {
		rec = testshop.Reconcile
	}
	return payoutScenarioWith(first, rec)
}

func payoutScenarioWith(first string, rec testshop.Reconciliation) atomicphasetest.Scenario {
	return atomicphasetest.Scenario{
		Name: "payout " + first,
		DB:   shopDB,
		// The test bank acts before it answers: once a call returned,
		// nothing of it is in flight, and the retry may reconcile at once
		// (Config.CallGrace; a nanosecond, so no retry meets it).
		Config: &atomicphase.Config{RetryBackoff: time.Millisecond, CallGrace: time.Nanosecond},
		Setup: func(t testing.TB, db *atomicphasetest.DB) *atomicphasetest.Trial {
			bank := testshop.NewBank()
			bank.First = first
			wf := testshop.PayoutWorkflowWith(bank, rec)
			return &atomicphasetest.Trial{
				Attempt: func(ctx context.Context, runner *atomicphase.Runner) (*atomicphase.Response, error) {
					return runner.Run(ctx, wf, testshop.Request())
				},
				Check: func(ctx context.Context, final *atomicphase.Response) error {
					return bank.CheckPayouts(ctx, db.Pool, final.Body)
				},
			}
		},
	}
}

// TestExplorePayoutEveryPointAndAction: a non-idempotent payout declared
// WithReconcile keeps "at most one effect per reference, exactly one once
// finished" under every point × action, whether the bank's first call is
// answered, acts and loses its answer, or fails without acting (the two
// downstream-side ways an outcome becomes unknown; the process dying after
// sending is the crash and panic actions at pay:after-foreign).
func TestExplorePayoutEveryPointAndAction(t *testing.T) {
	if testing.Short() {
		t.Skip("a sweep of fault points over many runs; make test-all runs it")
	}
	t.Parallel()
	for _, first := range []string{"", testshop.BankActThenLose, testshop.BankRefuseThenLose} {
		t.Run("first="+first, func(t *testing.T) {
			t.Parallel()
			rep := atomicphasetest.Explore(t, payoutScenario(first, true))
			require.Greater(t, len(rep.Rows), 1)
			for _, row := range rep.Rows {
				require.Equal(t, "201", row.Outcome, "%v", row.Faults)
			}
			if first == "" {
				require.Len(t, uniq(rep.Points), 10)
			}
			require.True(t, uniq(rep.Points)[atomicphase.FaultPoint{Workflow: "payout", Phase: "pay", Place: atomicphase.AfterForeign}],
				"the point right after the call is explored")
			ran := map[faultinject.Action]bool{}
			for _, row := range rep.Rows[1:] {
				if len(row.Unfired) == 0 {
					ran[row.Faults[len(row.Faults)-1].Action] = true
				}
			}
			require.True(t, ran[faultinject.SlowCall], "a payout slower than the lease")
			if first != "" {
				require.True(t, ran[faultinject.LoseTakeAck], "a lost take answer on the reconciling attempt")
			}
		})
	}
}

// TestExplorePayoutRandomConsecutiveFaults faults the reconciling retries
// too, after a first answer lost.
func TestExplorePayoutRandomConsecutiveFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("a sweep of fault points over many runs; make test-all runs it")
	}
	t.Parallel()
	rep := atomicphasetest.ExploreRandom(t, payoutScenario(testshop.BankActThenLose, true), 20261123, 25)
	for _, row := range rep.Rows[1:] {
		require.Equal(t, "201", row.Outcome)
	}
}

// TestExplorerCatchesAnUnreconciledPayout: the same non-idempotent bank
// call declared without WithReconcile pays twice once an attempt fails
// between the call and the commit that records it. With every action the
// explorer catches it at the first such fault (a backend terminated after
// create_order's commit breaks the connection pay's commit then uses);
// with crashes only, at the process dying right after the call. Either
// way the report names the point and action.
func TestExplorerCatchesAnUnreconciledPayout(t *testing.T) {
	if testing.Short() {
		t.Skip("a sweep of fault points over many runs; make test-all runs it")
	}
	t.Parallel()
	for _, c := range []struct {
		name    string
		actions []faultinject.Action
		point   string
	}{
		{"every action", nil, ""},
		{"crashes only", []faultinject.Action{faultinject.Crash}, "payout:pay:after-foreign"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			sc := payoutScenario("", false)
			sc.Actions = c.actions
			rep := atomicphasetest.Survey(t, sc)
			v := rep.Violation()
			require.NotNil(t, v, "the explorer must catch this workflow:\n%s", rep)
			require.ErrorContains(t, v.Violation, "effects for reference")
			require.ErrorContains(t, v.Violation, "want at most 1")
			require.NotEmpty(t, v.Faults, "the report names the point and action that broke it")
			require.Contains(t, rep.String(), "VIOLATED")
			require.Contains(t, rep.String(), v.Faults[0].Point.String())
			if c.point != "" {
				require.Equal(t, c.point, v.Faults[0].Point.String())
				require.Equal(t, faultinject.Crash, v.Faults[0].Action)
			}
			t.Logf("caught at %v: %v", v.Faults, v.Violation)
		})
	}
}

// TestExplorerFaultsEveryAttemptOfTheCleanRun: when the bank's first answer
// is lost, the clean run takes two attempts (409, then a retry that
// reconciles), and the second attempt's points — after-acquire, the
// commit recording what the reconcile found, confirm's — are explored
// too, each with every action. A reconcile with a side effect of its own
// (an acknowledgement at the bank) runs only on a later attempt, so only a
// fault on the second attempt repeats it: the explorer must catch that.
func TestExplorerFaultsEveryAttemptOfTheCleanRun(t *testing.T) {
	if testing.Short() {
		t.Skip("a sweep of fault points over many runs; make test-all runs it")
	}
	t.Parallel()
	t.Run("sound", func(t *testing.T) {
		t.Parallel()
		rep := atomicphasetest.Explore(t, payoutScenario(testshop.BankActThenLose, true))
		require.Len(t, rep.Attempts, 2, "the clean run takes two attempts")
		require.Len(t, rep.Coverage.Attempts, 2)
		second := rep.Coverage.Attempts[1]
		require.Positive(t, second.Points)
		require.Positive(t, second.Run, "the second attempt's points are faulted")
		faultedSecond := map[atomicphase.FaultPoint]bool{}
		for _, row := range rep.Rows[1:] {
			require.Equal(t, "201", row.Outcome, "%v", row.Faults)
			if f := row.Faults[0]; f.Attempt == 2 {
				faultedSecond[f.Point] = true
			}
		}
		require.True(t, faultedSecond[atomicphase.FaultPoint{Workflow: "payout", Place: atomicphase.AfterAcquire}])
		require.True(t, faultedSecond[atomicphase.FaultPoint{Workflow: "payout", Phase: "confirm", Place: atomicphase.BeforeCommit}])
		require.Positive(t, rep.Coverage.Consecutive, "plans fault consecutive attempts too")
		require.Contains(t, rep.String(), "coverage:")
	})
	t.Run("reconcile with a side effect", func(t *testing.T) {
		t.Parallel()
		rep := atomicphasetest.Survey(t, payoutScenarioWith(testshop.BankActThenLose, testshop.ReconcileAndAck))
		v := rep.Violation()
		require.NotNil(t, v, "the explorer must catch this workflow:\n%s", rep)
		require.ErrorContains(t, v.Violation, "acknowledgements for reference")
		require.Equal(t, 2, v.Faults[0].Attempt, "caught by a fault on the attempt that reconciles")
		require.Contains(t, rep.String(), "VIOLATED")
		t.Logf("caught at %v: %v", v.Faults, v.Violation)
	})
}

// TestExplorerFaultsTheSweepFinishingAKey: with Scenario.Sweep, the sweep
// runs after every failed attempt, before the client's retry; when the
// bank's first answer is lost, the clean run is the client's 409, the sweep
// reconciling and finishing the key, and the client's replay, and the
// sweep's points are faulted with every action like the client's.
func TestExplorerFaultsTheSweepFinishingAKey(t *testing.T) {
	if testing.Short() {
		t.Skip("a sweep of fault points over many runs; make test-all runs it")
	}
	t.Parallel()
	sc := payoutScenario(testshop.BankActThenLose, true)
	sc.Sweep = true
	rep := atomicphasetest.Explore(t, sc)
	require.Len(t, rep.Attempts, 3, "client, sweep, client")
	require.Positive(t, rep.Coverage.Attempts[1].Run, "the sweep's attempt is faulted")
	sweepFaults := 0
	for _, row := range rep.Rows[1:] {
		require.Equal(t, "201", row.Outcome, "%v", row.Faults)
		if row.Faults[0].Attempt == 2 {
			sweepFaults++
		}
	}
	require.Positive(t, sweepFaults)

	t.Run("reconcile with a side effect", func(t *testing.T) {
		t.Parallel()
		sc := payoutScenarioWith(testshop.BankActThenLose, testshop.ReconcileAndAck)
		sc.Sweep = true
		v := atomicphasetest.Survey(t, sc).Violation()
		require.NotNil(t, v)
		require.ErrorContains(t, v.Violation, "acknowledgements for reference")
		require.Equal(t, 2, v.Faults[0].Attempt, "caught by a fault on the sweep's attempt")
	})
}
