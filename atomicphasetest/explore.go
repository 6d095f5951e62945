package atomicphasetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

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
}

// Explore runs the scenario once cleanly, recording every fault point it
// passes; then, for every point × action, runs it again from a clean
// database with that fault injected once, retries until a final answer
// (taking over the crashed attempt's stale lock through the real
// acquisition path, by ageing the lock instead of sleeping for the lock
// timeout), and checks the invariants. It fails t on the first violated
// invariant, naming the point and action, and logs the table.
func Explore(t *testing.T, sc Scenario) *Report {
	t.Helper()
	rep := Survey(t, sc)
	failOn(t, sc, rep)
	return rep
}

// ExploreRandom is Explore's seeded random mode: each of runs runs injects
// faults on one to three consecutive attempts (so the retry crashes too),
// each a random point × action. The same seed replays the same faults.
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
	rep := &Report{Scenario: sc.Name, Points: e.points}
	rep.Rows = append(rep.Rows, e.clean)
	if e.clean.Violation != nil {
		return rep
	}
	for _, p := range uniquePoints(e.points) {
		for _, action := range e.actions {
			if !applicable(action, p) {
				continue
			}
			row := e.run([][]Fault{{{Point: p.Point, Action: action}}})
			rep.Rows = append(rep.Rows, row)
			if row.Violation != nil {
				return rep
			}
		}
	}
	return rep
}

// SurveyRandom is ExploreRandom without failing t.
func SurveyRandom(t testing.TB, sc Scenario, seed uint64, runs int) *Report {
	t.Helper()
	e := newExplorer(t, sc)
	rep := &Report{Scenario: fmt.Sprintf("%s (random, seed %d)", sc.Name, seed), Points: e.points}
	rep.Rows = append(rep.Rows, e.clean)
	if e.clean.Violation != nil {
		return rep
	}
	rng := rand.New(rand.NewPCG(seed, seed^0x5851f42d4c957f2d))
	var choices []Fault
	for _, p := range uniquePoints(e.points) {
		for _, a := range e.actions {
			if applicable(a, p) {
				choices = append(choices, Fault{Point: p.Point, Action: a})
			}
		}
	}
	for range runs {
		plan := make([][]Fault, 1+rng.IntN(3))
		for i := range plan {
			plan[i] = []Fault{choices[rng.IntN(len(choices))]}
		}
		row := e.run(plan)
		rep.Rows = append(rep.Rows, row)
		if row.Violation != nil {
			return rep
		}
	}
	return rep
}

type explorer struct {
	t       testing.TB
	sc      Scenario
	actions []faultinject.Action
	points  []faultinject.Passed
	clean   Row
	want    *atomicphase.Response
}

func newExplorer(t testing.TB, sc Scenario) *explorer {
	t.Helper()
	if sc.Setup == nil {
		t.Fatal("atomicphasetest: Scenario.Setup is required")
	}
	if sc.MaxAttempts == 0 {
		sc.MaxAttempts = 8
	}
	e := &explorer{t: t, sc: sc, actions: sc.Actions}
	if len(e.actions) == 0 {
		e.actions = faultinject.InProcessActions
	}
	if slices.Contains(e.actions, faultinject.Exit) {
		t.Fatal("atomicphasetest: the exit action would kill the test; run it in a child process with faultinject.FromEnv")
	}
	var final *atomicphase.Response
	e.clean, e.points, final = e.runRecorded(nil)
	if e.clean.Violation == nil && len(e.points) == 0 {
		e.clean.Violation = errors.New("the clean run passed no fault point: is Trial.Attempt using the runner it is given?")
	}
	e.want = final
	return e
}

func (e *explorer) run(plan [][]Fault) Row {
	row, _, _ := e.runRecorded(plan)
	return row
}

// runRecorded runs the trial on a clean database, injecting plan[i] on the
// i-th attempt, and returns the row, the points the first attempt passed and
// the final response.
func (e *explorer) runRecorded(plan [][]Fault) (Row, []faultinject.Passed, *atomicphase.Response) {
	ctx := context.Background()
	opts := Options{}
	if e.sc.DB != nil {
		opts = *e.sc.DB
	}
	userPoolConfig := opts.PoolConfig
	opts.PoolConfig = func(cfg *pgxpool.Config) {
		if userPoolConfig != nil {
			userPoolConfig(cfg)
		}
		faultinject.InstallDialer(cfg.ConnConfig)
	}
	row := Row{Outcome: "-"}
	for _, faults := range plan {
		row.Faults = append(row.Faults, faults...)
	}
	db, err := Open(ctx, &opts)
	if err != nil {
		e.t.Fatal(err)
	}
	defer func() {
		if err := db.Close(); err != nil {
			e.t.Error(err)
		}
	}()
	trial := e.sc.Setup(e.t, db)
	if trial == nil || trial.Attempt == nil {
		e.t.Fatal("atomicphasetest: Scenario.Setup must return a Trial with an Attempt")
	}
	if trial.Close != nil {
		defer trial.Close()
	}
	cfg := atomicphase.Config{}
	if e.sc.Config != nil {
		cfg = *e.sc.Config
	}
	sw := &switchable{}
	cfg.FaultInjector = sw
	runner, err := atomicphase.NewRunner(db.Pool, &cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	lockTimeout := cfg.LockTimeout
	if lockTimeout == 0 {
		lockTimeout = atomicphase.DefaultLockTimeout
	}

	var firstPassed []faultinject.Passed
	var final *atomicphase.Response
	var lastErr error
	panicked := false
	for attempt := 1; attempt <= e.sc.MaxAttempts && final == nil; attempt++ {
		var rules []faultinject.Rule
		if attempt <= len(plan) {
			for _, f := range plan[attempt-1] {
				rules = append(rules, faultinject.Rule{Workflow: f.Point.Workflow, Phase: f.Point.Phase, Place: f.Point.Place, Action: f.Action})
			}
		}
		if panicked {
			// A panic parks the key: it is a bug, which the retries cannot
			// get past. The injected one is "fixed" at once; the operator
			// unparks the key, as the runbook says, and the client's
			// retries go on.
			if err := unparkAll(ctx, runner); err != nil {
				e.t.Fatal(err)
			}
			panicked = false
		}
		inj := faultinject.New(rules...)
		inj.Admin = db.Pool
		sw.set(inj)
		row.Attempts = attempt
		resp, err := attemptOnce(ctx, runner, trial)
		var pe *panicError
		panicked = errors.As(err, &pe)
		if attempt == 1 {
			firstPassed = inj.Passed()
		}
		switch {
		case err == nil:
			final = resp
		case final == nil && !atomicphase.Retryable(err):
			row.Outcome = "error: " + err.Error()
			row.Violation = fmt.Errorf("the request ended in an error a client would not retry: %w", err)
			return row, firstPassed, nil
		default:
			lastErr = err
			// A crashed attempt leaves its lock behind; let the lock
			// timeout pass, as it would for a client retrying later.
			if errors.Is(err, atomicphase.ErrCrashed) || errors.Is(err, atomicphase.ErrInProgress) {
				if err := AgeLocks(ctx, db.Pool, lockTimeout); err != nil {
					e.t.Fatal(err)
				}
			}
		}
	}
	sw.set(nil)
	if final == nil {
		row.Outcome = "no final answer"
		row.Violation = fmt.Errorf("no final answer after %d attempts; last error: %v", row.Attempts, lastErr)
		return row, firstPassed, nil
	}
	row.Outcome = fmt.Sprint(final.Status)
	row.Violation = e.check(ctx, runner, trial, final)
	return row, firstPassed, final
}

// check applies the built-in invariants and the trial's own.
func (e *explorer) check(ctx context.Context, runner *atomicphase.Runner, trial *Trial, final *atomicphase.Response) error {
	if e.want != nil && (final.Status != e.want.Status || e.sc.SameBodyAsCleanRun && !bytes.Equal(final.Body, e.want.Body)) {
		return fmt.Errorf("final response %d %q differs from the clean run's %d %q", final.Status, final.Body, e.want.Status, e.want.Body)
	}
	// A client retrying after the final answer (its response was lost,
	// say) retries 5xx like any other; what it finally gets must be the
	// same answer.
	var replay *atomicphase.Response
	var err error
	for range e.sc.MaxAttempts {
		// Retryable is false for nil too: stop at any final answer.
		if replay, err = attemptOnce(ctx, runner, trial); !atomicphase.Retryable(err) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("a retry after the final answer failed: %w", err)
	}
	if replay.Status != final.Status || !bytes.Equal(replay.Body, final.Body) {
		return fmt.Errorf("a retry after the final answer got %d %q, not %d %q", replay.Status, replay.Body, final.Status, final.Body)
	}
	if trial.Check != nil {
		return trial.Check(ctx, final)
	}
	return nil
}

// attemptOnce sends the request once, turning an injected panic (re-raised
// by the Runner after unlocking) into an error.
func attemptOnce(ctx context.Context, runner *atomicphase.Runner, trial *Trial) (resp *atomicphase.Response, err error) {
	defer func() {
		if p := recover(); p != nil {
			ip, ok := p.(*faultinject.InjectedPanic)
			if !ok {
				panic(p)
			}
			resp, err = nil, &panicError{ip}
		}
	}()
	return trial.Attempt(ctx, runner)
}

// panicError is an attempt that ended in an injected panic.
type panicError struct{ p *faultinject.InjectedPanic }

func (e *panicError) Error() string { return e.p.String() }

// unparkAll unparks every parked key, as an operator does once the bug
// that parked them is fixed.
func unparkAll(ctx context.Context, runner *atomicphase.Runner) error {
	keys, err := runner.ListKeys(ctx, &atomicphase.KeyFilter{Status: atomicphase.KeyParked})
	if err != nil {
		return err
	}
	for _, k := range keys {
		if err := runner.Unpark(ctx, k.Scope, k.Key); err != nil {
			return err
		}
	}
	return nil
}

func uniquePoints(passed []faultinject.Passed) []faultinject.Passed {
	var out []faultinject.Passed
	seen := map[atomicphase.FaultPoint]bool{}
	for _, p := range passed {
		if !seen[p.Point] {
			seen[p.Point] = true
			out = append(out, p)
		}
	}
	return out
}

// applicable says whether an action can do anything at a point:
// TerminateBackend needs a held connection, LoseCommitAck a commit to come.
func applicable(a faultinject.Action, p faultinject.Passed) bool {
	switch a {
	case faultinject.TerminateBackend:
		return p.HasConn
	case faultinject.LoseCommitAck:
		return p.HasConn && p.Point.Place == atomicphase.BeforeCommit
	}
	return true
}

// switchable lets the explorer change the injector between attempts of one
// Runner.
type switchable struct {
	inj atomic.Pointer[faultinject.Injector]
}

func (s *switchable) set(inj *faultinject.Injector) { s.inj.Store(inj) }

func (s *switchable) InjectFault(ctx context.Context, at atomicphase.FaultPoint, conn *pgx.Conn) error {
	return s.inj.Load().InjectFault(ctx, at, conn)
}
