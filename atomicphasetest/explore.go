package atomicphasetest

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"testing"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/faultinject"
)

// Scenario is one request to explore under faults: how to set up a clean
// run, how to send the request once, and the invariants that must hold once
// it has a final answer.
type Scenario struct {
	// Name labels the report.
	Name string

	// DB configures the clean database every run gets (the application's
	// schema, through Setup and SetupID). The explorer adds its dialer to
	// PoolConfig. Defaults to the atomicphase schema only.
	DB *Options

	// Config is the Runner configuration; the explorer sets its
	// FaultInjector. Defaults to atomicphase's defaults.
	Config *atomicphase.Config

	// Setup prepares one run on its clean database — starting a fake
	// downstream, say — and returns the trial to drive. Required.
	Setup func(t testing.TB, db *DB) *Trial

	// MaxAttempts bounds how many times a run's request is sent before the
	// run counts as never reaching a final answer. Defaults to 8.
	MaxAttempts int

	// Actions are the actions tried at every point. Defaults to
	// faultinject.InProcessActions. faultinject.Exit is refused: it would
	// kill the test itself; use faultinject.FromEnv in a child process for
	// that.
	Actions []faultinject.Action

	// SameBodyAsCleanRun adds the invariant that every run's final body
	// equals the clean run's byte for byte. Leave it off when the body
	// carries values a rolled-back attempt may consume, such as ids drawn
	// from a sequence; the built-in invariants already require the clean
	// run's status, and that every retry after the final answer gets that
	// answer byte for byte. Defaults to false.
	SameBodyAsCleanRun bool

	// Sweep runs the sweep (Sweeper.RunOnce) after every attempt that
	// fails, before the client's retry, with locks and backoffs aged as the
	// passage of time would: the sweep finishes the key, and its run is an
	// attempt of its own, explored like the client's (its points faulted
	// with every action). Defaults to false: the client retries alone.
	Sweep bool

	// Consecutive is how many consecutive attempts a plan of Explore may
	// fault: after the plan that faults attempt k at a point, plans that
	// fault attempts k, k+1, … at that point with the same action, as long
	// as the retry passes the point again (a crash looping at the same
	// place). 1 faults single attempts only. Defaults to 2.
	Consecutive int

	// Out receives the report table when the exploration ends. Defaults to
	// the test log.
	Out io.Writer
}

// Trial is one run's request and invariants.
type Trial struct {
	// Attempt sends the request once, as a client would, through the
	// runner (directly or through an HTTP handler built on it). Required.
	Attempt func(ctx context.Context, runner *atomicphase.Runner) (*atomicphase.Response, error)

	// Check verifies the invariants once the request has its final
	// answer: distinct effects at the downstream, rows in the database.
	// Defaults to no check beyond the built-in ones.
	Check func(ctx context.Context, final *atomicphase.Response) error

	// Close releases the run's fixtures. Defaults to nothing.
	Close func()

	// HTTP, when set, is what the downstream clients' transports were
	// made with (HTTP.Transport, below ForeignCall.Transport where the
	// phase uses it): the explorer then drops the connection of a foreign
	// phase's request after the downstream read it
	// (faultinject.DropAfterRequest). Defaults to none: that action is
	// skipped.
	HTTP *faultinject.HTTP
}

// Explore runs the scenario once cleanly, recording every fault point every
// attempt of it passes (a clean run may take several: a downstream answer
// lost, then a retry that reconciles); then, for every attempt × point ×
// action, runs it again from a clean database with that fault injected on
// that attempt, retries until a final answer (taking over a crashed
// attempt's stale lock through the real acquisition path, by ageing the
// lock instead of sleeping for the lock timeout), and checks the
// invariants; then faults consecutive attempts at the same point, where the
// retry passes it again (Scenario.Consecutive). It fails t on the first
// violated invariant, naming the attempt, point and action, and logs the
// table and its coverage.
func Explore(t *testing.T, sc Scenario) *Report {
	t.Helper()
	rep := Survey(t, sc)
	failOn(t, sc, rep)
	return rep
}

// ExploreRandom is Explore's seeded random mode: each of runs runs injects
// faults on one to three consecutive attempts (so the retry crashes too),
// each a random point × action among those the clean run's attempts passed.
// The same seed replays the same faults.
func ExploreRandom(t *testing.T, sc Scenario, seed uint64, runs int) *Report {
	t.Helper()
	rep := SurveyRandom(t, sc, seed, runs)
	failOn(t, sc, rep)
	return rep
}

func failOn(t *testing.T, sc Scenario, rep *Report) {
	t.Helper()
	report(t, sc, rep)
	if v := rep.Violation(); v != nil {
		t.Fatalf("atomicphasetest: invariant violated after %v (%d attempts, outcome %s): %v", v.Faults, v.Attempts, v.Outcome, v.Violation)
	}
}

func report(t testing.TB, sc Scenario, rep *Report) {
	if sc.Out != nil {
		fmt.Fprint(sc.Out, rep.String())
	} else {
		t.Log("\n" + rep.String())
	}
}

// Survey is Explore without failing t: it stops at the first violation and
// returns the report, for tests that expect a workflow to be broken.
func Survey(t testing.TB, sc Scenario) *Report {
	t.Helper()
	e := newExplorer(t, sc)
	rep := e.newReport(sc.Name)
	if e.clean.Violation != nil {
		return rep
	}
	e.exhaust(rep)
	return rep
}

// SurveyRandom is ExploreRandom without failing t.
func SurveyRandom(t testing.TB, sc Scenario, seed uint64, runs int) *Report {
	t.Helper()
	e := newExplorer(t, sc)
	rep := e.newReport(fmt.Sprintf("%s (random, seed %d)", sc.Name, seed))
	rep.Coverage = Coverage{}
	if e.clean.Violation != nil {
		return rep
	}
	rng := rand.New(rand.NewPCG(seed, seed^0x5851f42d4c957f2d))
	var choices []Fault
	for k, passed := range e.attempts {
		for _, p := range uniquePoints(passed) {
			for _, a := range e.actions {
				if skip := e.skipReason(a, p); skip == "" {
					choices = append(choices, Fault{Point: p.Point, Action: a, Attempt: k + 1})
				}
			}
		}
	}
	for range runs {
		// A plan starts at the attempt of its first choice and faults one
		// to three consecutive attempts from there.
		first := choices[rng.IntN(len(choices))]
		plan := make([][]Fault, first.Attempt-1, first.Attempt+2)
		plan = append(plan, []Fault{first})
		for range rng.IntN(3) {
			f := choices[rng.IntN(len(choices))]
			f.Attempt = len(plan) + 1
			plan = append(plan, []Fault{f})
		}
		row := e.run(plan)
		rep.Rows = append(rep.Rows, row)
		if row.Violation != nil {
			return rep
		}
	}
	return rep
}
