package atomicphasetest_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
	"github.com/atomicphase/atomicphase/atomicphasetest/fakestripe"
	"github.com/atomicphase/atomicphase/faultinject"
	"github.com/atomicphase/atomicphase/internal/testshop"
)

var shopDB = &atomicphasetest.Options{SetupID: testshop.SetupID, Setup: testshop.Setup}

// shopScenario explores the test shop's one request (broken as f says).
func shopScenario(f testshop.Flaw) atomicphasetest.Scenario {
	return atomicphasetest.Scenario{
		Name:   "shop",
		DB:     shopDB,
		Config: &atomicphase.Config{RetryBackoff: time.Millisecond},
		Setup: func(t testing.TB, db *atomicphasetest.DB) *atomicphasetest.Trial {
			payments, err := fakestripe.Start()
			if err != nil {
				t.Fatal(err)
			}
			wf := testshop.Workflow(payments.URL, db.Pool, f)
			return &atomicphasetest.Trial{
				Attempt: func(ctx context.Context, runner *atomicphase.Runner) (*atomicphase.Response, error) {
					return runner.Run(ctx, wf, testshop.Request())
				},
				Check: func(ctx context.Context, final *atomicphase.Response) error {
					return testshop.Check(ctx, db.Pool, payments, final.Body)
				},
				Close: func() { _ = payments.Close() },
			}
		},
	}
}

func TestExploreEveryPointAndAction(t *testing.T) {
	if testing.Short() {
		t.Skip("a sweep of fault points over many runs; make test-all runs it")
	}
	t.Parallel()
	sc := shopScenario(testshop.Sound)
	if testing.Verbose() {
		sc.Out = os.Stdout
	}
	rep := atomicphasetest.Explore(t, sc)

	// 10 points: before acquisition; create_order's 3 (before the phase,
	// before and after the commit that also records the key); charge's 2
	// (before the call and after it); confirm's 4 (before the phase, the
	// response, the commit it shares with charge's record step, and after).
	require.Len(t, uniq(rep.Points), 10)
	runs := map[faultinject.Action]int{}
	consecutive := 0
	for _, row := range rep.Rows[1:] {
		require.Equal(t, "201", row.Outcome)
		if len(row.Faults) > 1 {
			// A retry that took another path under load (and never
			// reached the point) counts as skipped, not as run.
			if len(row.Unfired) == 0 {
				consecutive++
			}
			continue
		}
		runs[row.Faults[0].Action]++
	}
	require.Len(t, rep.Coverage.Attempts, 1, "the clean run takes one attempt")
	require.Equal(t, 10, rep.Coverage.Attempts[0].Points)
	require.Equal(t, consecutive, rep.Coverage.Consecutive)
	require.Positive(t, consecutive, "the retry is faulted at the same point too")
	require.Equal(t, 10, runs[faultinject.Crash])
	require.Equal(t, 10, runs[faultinject.Error])
	require.Equal(t, 10, runs[faultinject.Panic])
	require.Equal(t, 10, runs[faultinject.Delay])
	require.Equal(t, 7, runs[faultinject.TerminateBackend], "every point where a connection is held")
	require.Equal(t, 2, runs[faultinject.LoseCommitAck], "every commit: one per foreign phase, plus one")
}

func TestExploreRandomConsecutiveFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("a sweep of fault points over many runs; make test-all runs it")
	}
	t.Parallel()
	rep := atomicphasetest.ExploreRandom(t, shopScenario(testshop.Sound), 20261122, 25)
	retriedUnderFault := 0
	for _, row := range rep.Rows[1:] {
		require.Equal(t, "201", row.Outcome)
		if len(row.Faults) > 1 && row.Attempts > 1 {
			retriedUnderFault++
		}
	}
	require.Positive(t, retriedUnderFault, "some runs fault the retries too")
	require.Contains(t, rep.Scenario, "seed 20261122")
}

func TestExplorerCatchesBrokenWorkflows(t *testing.T) {
	if testing.Short() {
		t.Skip("a sweep of fault points over many runs; make test-all runs it")
	}
	t.Parallel()
	cases := []struct {
		name   string
		flaw   testshop.Flaw
		broken string // the invariant that must be reported
		// clean: caught with no fault at all. A write outside the phase's
		// transaction is repeated by the replay the explorer sends after
		// the final answer, not marked as a retry: its first phase's code
		// runs ahead of the key's read, and only what it queued on the
		// transaction is discarded.
		clean bool
	}{
		{"fresh downstream key on every attempt", testshop.RandomKey, "distinct charges at the downstream", false},
		{"foreign call outside the guard", testshop.OutsideGuard, "distinct charges at the downstream", false},
		{"business write outside the phase transaction", testshop.OutsideTx, "order rows", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			rep := atomicphasetest.Survey(t, shopScenario(c.flaw))
			v := rep.Violation()
			require.NotNil(t, v, "the explorer must catch this workflow:\n%s", rep)
			require.ErrorContains(t, v.Violation, c.broken)
			if !c.clean {
				require.NotEmpty(t, v.Faults, "the report names the point and action that broke it")
			}
			require.Contains(t, rep.String(), "VIOLATED")
			t.Logf("caught at %v: %v", v.Faults, v.Violation)
		})
	}
}

// TestExplorerReportsAFinalErrorAsAViolation: a request that ends in an
// answer no retry changes (here a malformed key) never reaches the final
// answer the invariants are about; the explorer reports it at once instead
// of retrying it.
func TestExplorerReportsAFinalErrorAsAViolation(t *testing.T) {
	t.Parallel()
	sc := shopScenario(testshop.Sound)
	setup := sc.Setup
	sc.Setup = func(t testing.TB, db *atomicphasetest.DB) *atomicphasetest.Trial {
		trial := setup(t, db)
		trial.Attempt = func(ctx context.Context, runner *atomicphase.Runner) (*atomicphase.Response, error) {
			req := testshop.Request()
			req.Key = strings.Repeat("k", 1000) // longer than the key limit
			return runner.Run(ctx, testshop.Workflow("http://unused", db.Pool, testshop.Sound), req)
		}
		return trial
	}
	rep := atomicphasetest.Survey(t, sc)
	v := rep.Violation()
	require.NotNil(t, v)
	require.Empty(t, v.Faults, "the clean run already fails")
	require.ErrorIs(t, v.Violation, atomicphase.ErrInvalidKey)
	require.ErrorContains(t, v.Violation, "a client would not retry")
	require.Equal(t, 1, v.Attempts, "a final error is not retried")
}

func TestScenarioRefusesTheExitAction(t *testing.T) {
	t.Parallel()
	sc := shopScenario(testshop.Sound)
	sc.Actions = []faultinject.Action{faultinject.Exit}
	ft := &fatalTB{TB: t}
	func() {
		defer func() {
			if p := recover(); p != ft {
				panic(p)
			}
		}()
		atomicphasetest.Survey(ft, sc)
	}()
	require.Contains(t, ft.msg, "would kill the test")
}

// fatalTB records the first Fatal instead of failing the test.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}

// Fatal records the message and stops the caller, as testing's Fatal does
// with runtime.Goexit.
func (f *fatalTB) Fatal(args ...any) {
	f.msg = fmt.Sprint(args...)
	panic(f)
}

func uniq(ps []faultinject.Passed) map[atomicphase.FaultPoint]bool {
	m := map[atomicphase.FaultPoint]bool{}
	for _, p := range ps {
		m[p.Point] = true
	}
	return m
}

// The shop with WorkflowOpts.AssumeNewKeys, its key's read riding in the
// first unit's batch: a fault at every point, and the retries that follow
// (replays and takes answered from that read), still make one charge and
// one order.
func TestExploreAssumingNewKeys(t *testing.T) {
	if testing.Short() {
		t.Skip("a sweep of fault points over many runs; make test-all runs it")
	}
	t.Parallel()
	sc := shopScenario(testshop.AssumingNew)
	if testing.Verbose() {
		sc.Out = os.Stdout
	}
	rep := atomicphasetest.Explore(t, sc)
	require.Len(t, uniq(rep.Points), 10, "the same points as without the option")
}
