package faultinject

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
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
	DB *atomicphasetest.Options

	// Config is the Runner configuration; the explorer sets its
	// FaultInjector. Defaults to atomicphase's defaults.
	Config *atomicphase.Config

	// Setup prepares one run on its clean database — starting a fake
	// downstream, say — and returns the trial to drive. Required.
	Setup func(t testing.TB, db *atomicphasetest.DB) *Trial

	// MaxAttempts bounds how many times a run's request is sent before the
	// run counts as never reaching a final answer. Defaults to 8.
	MaxAttempts int

	// Actions are the actions tried at every point. Defaults to
	// InProcessActions. Exit is refused: it would kill the test itself;
	// use FromEnv in a child process for that.
	Actions []Action

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

// Row is one explored run.
type Row struct {
	// Faults lists the faults injected, one per faulted attempt.
	Faults []Fault
	// Attempts is how many times the request was sent.
	Attempts int
	// Outcome is the final answer ("201") or why there was none.
	Outcome string
	// Violation is the invariant that failed, or nil.
	Violation error
}

// Fault is an action at a point.
type Fault struct {
	Point  atomicphase.FaultPoint
	Action Action
}

// String renders the fault as "workflow:phase:place action".
func (f Fault) String() string { return f.Point.String() + " " + string(f.Action) }

// Report is the result of an exploration.
type Report struct {
	Scenario string
	// Points are the fault points the clean run passed, in order.
	Points []Passed
	Rows   []Row
}

// Violation returns the first run that violated an invariant, or nil.
func (r *Report) Violation() *Row {
	for i := range r.Rows {
		if r.Rows[i].Violation != nil {
			return &r.Rows[i]
		}
	}
	return nil
}

// String renders the report as a table: point, action, attempts, final
// outcome, invariant.
func (r *Report) String() string {
	var b bytes.Buffer
	fmt.Fprintf(&b, "fault exploration %q: %d points, %d runs\n", r.Scenario, len(r.Points), len(r.Rows))
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "POINT\tACTION\tATTEMPTS\tOUTCOME\tINVARIANT")
	for _, row := range r.Rows {
		verdict := "ok"
		if row.Violation != nil {
			verdict = "VIOLATED: " + row.Violation.Error()
		}
		points, actions := "(none)", "-"
		if len(row.Faults) > 0 {
			var ps, as []string
			for _, f := range row.Faults {
				ps, as = append(ps, f.Point.String()), append(as, string(f.Action))
			}
			points, actions = strings.Join(ps, " → "), strings.Join(as, " → ")
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\n", points, actions, row.Attempts, row.Outcome, verdict)
	}
	_ = w.Flush()
	return b.String()
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
		t.Fatalf("faultinject: invariant violated after %v (%d attempts, outcome %s): %v", v.Faults, v.Attempts, v.Outcome, v.Violation)
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
	actions []Action
	points  []Passed
	clean   Row
	want    *atomicphase.Response
}

func newExplorer(t testing.TB, sc Scenario) *explorer {
	t.Helper()
	if sc.Setup == nil {
		t.Fatal("faultinject: Scenario.Setup is required")
	}
	if sc.MaxAttempts == 0 {
		sc.MaxAttempts = 8
	}
	e := &explorer{t: t, sc: sc, actions: sc.Actions}
	if len(e.actions) == 0 {
		e.actions = InProcessActions
	}
	if slices.Contains(e.actions, Exit) {
		t.Fatal("faultinject: the exit action would kill the test; run it in a child process with FromEnv")
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
func (e *explorer) runRecorded(plan [][]Fault) (Row, []Passed, *atomicphase.Response) {
	ctx := context.Background()
	opts := atomicphasetest.Options{}
	if e.sc.DB != nil {
		opts = *e.sc.DB
	}
	userPoolConfig := opts.PoolConfig
	opts.PoolConfig = func(cfg *pgxpool.Config) {
		if userPoolConfig != nil {
			userPoolConfig(cfg)
		}
		InstallDialer(cfg.ConnConfig)
	}
	row := Row{Outcome: "-"}
	for _, faults := range plan {
		row.Faults = append(row.Faults, faults...)
	}
	db, err := atomicphasetest.Open(ctx, &opts)
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
		e.t.Fatal("faultinject: Scenario.Setup must return a Trial with an Attempt")
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

	var firstPassed []Passed
	var final *atomicphase.Response
	var lastErr error
	for attempt := 1; attempt <= e.sc.MaxAttempts && final == nil; attempt++ {
		inj := New()
		if attempt <= len(plan) {
			for _, f := range plan[attempt-1] {
				inj.rules = append(inj.rules, Rule{Workflow: f.Point.Workflow, Phase: f.Point.Phase, Place: f.Point.Place, Action: f.Action})
				inj.fired = append(inj.fired, 0)
			}
		}
		inj.Admin = db.Pool
		sw.set(inj)
		row.Attempts = attempt
		resp, err := attemptOnce(ctx, runner, trial)
		if attempt == 1 {
			firstPassed = inj.Passed()
		}
		switch {
		case err == nil:
			final = resp
		case final == nil && isFinalError(err):
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
		if replay, err = attemptOnce(ctx, runner, trial); err == nil || isFinalError(err) {
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
			ip, ok := p.(*InjectedPanic)
			if !ok {
				panic(p)
			}
			resp, err = nil, fmt.Errorf("%s", ip)
		}
	}()
	return trial.Attempt(ctx, runner)
}

// isFinalError reports the answers a well-behaved client does not retry:
// the 4xx family. In-progress and everything transient are retried.
func isFinalError(err error) bool {
	return errors.Is(err, atomicphase.ErrFingerprintMismatch) ||
		errors.Is(err, atomicphase.ErrInvalidKey) ||
		errors.Is(err, atomicphase.ErrInvalidRequest)
}

// AgeLocks moves every held lock in the database back by lockTimeout, so the
// next attempt finds it stale and takes it over through the ordinary
// acquisition path: the passage of time after a crash, without the wait.
func AgeLocks(ctx context.Context, db interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, lockTimeout time.Duration) error {
	_, err := db.Exec(ctx, `UPDATE idempotency_keys SET locked_at = locked_at - $1 * interval '1 microsecond'
		WHERE locked_at IS NOT NULL`, lockTimeout.Microseconds())
	return err
}

func uniquePoints(passed []Passed) []Passed {
	var out []Passed
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
func applicable(a Action, p Passed) bool {
	switch a {
	case TerminateBackend:
		return p.HasConn
	case LoseCommitAck:
		return p.HasConn && p.Point.Place == atomicphase.BeforeCommit
	}
	return true
}

// switchable lets the explorer change the injector between attempts of one
// Runner.
type switchable struct {
	inj atomic.Pointer[Injector]
}

func (s *switchable) set(inj *Injector) { s.inj.Store(inj) }

func (s *switchable) InjectFault(ctx context.Context, at atomicphase.FaultPoint, conn *pgx.Conn) error {
	return s.inj.Load().InjectFault(ctx, at, conn)
}
