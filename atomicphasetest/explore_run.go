package atomicphasetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/faultinject"
	"github.com/atomicphase/atomicphase/internal/keystore"
)

// explorer runs a scenario's trials: the clean run, then one per plan.
type explorer struct {
	t       testing.TB
	sc      Scenario
	actions []faultinject.Action
	// attempts are the points each attempt of the clean run passed, in
	// order, repeats included.
	attempts [][]faultinject.Passed
	clean    Row
	want     *atomicphase.Response
	// foreign are the phases the clean run made foreign calls in; http
	// says whether its trial gave the explorer an HTTP transport.
	foreign map[string]bool
	http    bool
}

// slowLease is the longest lease a run with a slow call (faultinject.SlowCall)
// runs under: the call's answer comes after slowFactor leases, and the
// client retries every half lease meanwhile.
const (
	slowLease  = 400 * time.Millisecond
	slowFactor = 2.5
)

func newExplorer(t testing.TB, sc Scenario) *explorer {
	t.Helper()
	if sc.Setup == nil {
		t.Fatal("atomicphasetest: Scenario.Setup is required")
	}
	if sc.MaxAttempts == 0 {
		sc.MaxAttempts = 8
	}
	if sc.Consecutive == 0 {
		sc.Consecutive = 2
	}
	if sc.Consecutive < 0 {
		t.Fatalf("atomicphasetest: Scenario.Consecutive is %d; use 1 or more, or 0 for the default 2", sc.Consecutive)
	}
	e := &explorer{t: t, sc: sc, actions: sc.Actions}
	if len(e.actions) == 0 {
		e.actions = faultinject.InProcessActions
	}
	if slices.Contains(e.actions, faultinject.Exit) {
		t.Fatal("atomicphasetest: the exit action would kill the test; run it in a child process with faultinject.FromEnv")
	}
	var final *atomicphase.Response
	e.clean, final = e.runTrial(nil)
	e.attempts = e.clean.passed
	e.foreign = map[string]bool{}
	for _, passed := range e.attempts {
		for _, p := range passed {
			if p.Point.Place == atomicphase.AfterForeign {
				e.foreign[p.Point.Phase] = true
			}
		}
	}
	if e.clean.Violation == nil && len(e.attempts) > 0 && len(e.attempts[0]) == 0 {
		e.clean.Violation = errors.New("the clean run passed no fault point: is Trial.Attempt using the runner it is given?")
	}
	e.want = final
	return e
}

func (e *explorer) run(plan [][]Fault) Row {
	row, _ := e.runTrial(plan)
	return row
}

// runTrial runs the trial on a clean database, injecting plan[i] on the
// (i+1)-th attempt, and returns the row (with the points every attempt
// passed and the faults that never fired) and the final response.
func (e *explorer) runTrial(plan [][]Fault) (Row, *atomicphase.Response) {
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
	if plan == nil {
		e.http = trial.HTTP != nil
	}
	cfg := atomicphase.Config{}
	if e.sc.Config != nil {
		cfg = *e.sc.Config
	}
	slow := slices.ContainsFunc(row.Faults, func(f Fault) bool { return f.Action == faultinject.SlowCall })
	if slow && (cfg.LockTimeout == 0 || cfg.LockTimeout > slowLease) {
		// A call slower than the lease, without waiting minutes for it.
		cfg.LockTimeout = slowLease
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

	// unfired collects the faults of the attempts that ran whose rule
	// never fired: the faulted attempt took another path than the clean
	// run's (or an earlier fault ended it first).
	planned := func(attempt int, inj *faultinject.Injector) {
		if attempt > len(plan) {
			return
		}
		for n, fired := range inj.Fired() {
			if fired == 0 {
				row.Unfired = append(row.Unfired, plan[attempt-1][n])
			}
		}
	}
	var sweeper *atomicphase.Sweeper
	if e.sc.Sweep {
		if sweeper, err = atomicphase.NewSweeper(runner, nil); err != nil {
			e.t.Fatal(err)
		}
	}
	sweepNext := false
	var final *atomicphase.Response
	var lastErr error
	var dups []*duplicate
	// A duplicate still running when the run ends is waited for: it
	// may hold the key, and the fixtures must outlive it.
	defer func() {
		for _, d := range dups {
			<-d.done
		}
	}()
	panicked := false
	for attempt := 1; attempt <= e.sc.MaxAttempts && final == nil; attempt++ {
		var rules []faultinject.Rule
		var dup *duplicate
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
		if attempt <= len(plan) {
			for _, f := range plan[attempt-1] {
				if f.Action == Duplicate {
					dup = &duplicate{point: f.Point, admin: db.Pool, send: func(ctx context.Context) (*atomicphase.Response, error) {
						return attemptOnce(ctx, runner, trial)
					}}
					continue
				}
				rule := faultinject.Rule{Workflow: f.Point.Workflow, Phase: f.Point.Phase, Place: f.Point.Place, Action: f.Action}
				if f.Action == faultinject.SlowCall {
					rule.Delay = time.Duration(slowFactor * float64(lockTimeout))
				}
				rules = append(rules, rule)
			}
		}
		inj := faultinject.New(rules...)
		inj.Admin = db.Pool
		inj.HTTP = trial.HTTP
		sw.set(inj, dup)
		row.Attempts = attempt
		if sweepNext {
			// This attempt is the sweep's: it resumes the key (or finds
			// nothing due), and the client retries next.
			sweepNext = false
			if err := sweepOnce(ctx, db, sweeper, lockTimeout); err != nil {
				lastErr = err
			}
			// A panic the plan injected into the sweep's run parked the key
			// too; the operator unparks it before the client's next retry.
			panicked = slices.ContainsFunc(rules, func(r faultinject.Rule) bool { return r.Action == faultinject.Panic })
			row.passed = append(row.passed, inj.Passed())
			planned(attempt, inj)
			if v := e.checkLostTake(ctx, runner, rules, inj); v != nil {
				row.Outcome, row.Violation = "error: "+fmt.Sprint(lastErr), v
				return row, nil
			}
			continue
		}
		// While an attempt may meet a slow call, its client (timed out)
		// sends the request again every half lease.
		var stopRetries func() []*duplicate
		if slices.ContainsFunc(rules, func(r faultinject.Rule) bool { return r.Action == faultinject.SlowCall }) {
			stopRetries = retryEvery(lockTimeout/2, func(ctx context.Context) (*atomicphase.Response, error) {
				return attemptOnce(ctx, runner, trial)
			})
		}
		resp, err := attemptOnce(ctx, runner, trial)
		if stopRetries != nil {
			dups = append(dups, stopRetries()...)
		}
		if trial.HTTP != nil {
			trial.HTTP.Disarm() // a drop no request met ends with its attempt
		}
		if fired(rules, inj, faultinject.SlowCall) && errors.Is(err, atomicphase.ErrLockLost) {
			row.Outcome = "error: " + err.Error()
			row.Violation = fmt.Errorf("the attempt lost its lease during a call slower than the lease (it renews it while the call runs): %w", err)
			return row, nil
		}
		if v := e.checkLostTake(ctx, runner, rules, inj); v != nil {
			row.Outcome, row.Violation = "error: "+fmt.Sprint(err), v
			return row, nil
		}
		var pe *panicError
		panicked = errors.As(err, &pe)
		row.passed = append(row.passed, inj.Passed())
		planned(attempt, inj)
		sweepNext = err != nil && sweeper != nil
		if dup.started() {
			dups = append(dups, dup)
		} else if dup != nil {
			row.Unfired = append(row.Unfired, Fault{Point: dup.point, Action: Duplicate, Attempt: attempt})
		}
		switch {
		case err == nil:
			final = resp
		case !atomicphase.Retryable(err):
			row.Outcome = "error: " + err.Error()
			row.Violation = fmt.Errorf("the request ended in an error a client would not retry: %w", err)
			return row, nil
		default:
			lastErr = err
			// A crashed attempt leaves its lock behind; let the lock
			// timeout pass, as it would for a client retrying later.
			if errors.Is(err, atomicphase.ErrCrashed) || errors.Is(err, atomicphase.ErrInProgress) {
				if err := AgeLocks(ctx, db.Pool, lockTimeout); err != nil {
					e.t.Fatal(err)
				}
			}
			if errors.Is(err, atomicphase.ErrInProgress) {
				// A client waits before it retries (Retry-After): a crashed
				// attempt's transaction, which holds the key's recording,
				// ends only when its server notices the closed connection.
				time.Sleep(time.Duration(attempt) * 20 * time.Millisecond)
			}
		}
	}
	sw.set(nil, nil)
	for attempt := row.Attempts + 1; attempt <= len(plan); attempt++ {
		row.Unfired = append(row.Unfired, plan[attempt-1]...)
	}
	if final == nil {
		row.Outcome = "no final answer"
		row.Violation = fmt.Errorf("no final answer after %d attempts; last error: %v", row.Attempts, lastErr)
		return row, nil
	}
	row.Outcome = fmt.Sprint(final.Status)
	for _, d := range dups {
		if err := d.verdict(final); err != nil {
			row.Violation = err
			return row, final
		}
	}
	row.Violation = e.check(ctx, runner, trial, final)
	return row, final
}

// checkLostTake checks, right after an attempt whose take lost its answer
// (and before any lock is aged), that no key is left held: the attempt
// unlocks the key it may have taken by its token.
func (e *explorer) checkLostTake(ctx context.Context, runner *atomicphase.Runner, rules []faultinject.Rule, inj *faultinject.Injector) error {
	if !fired(rules, inj, faultinject.LoseTakeAck) {
		return nil
	}
	held, err := runner.ListKeys(ctx, &atomicphase.KeyFilter{Status: atomicphase.KeyInProgress})
	if err != nil {
		return err
	}
	if len(held) > 0 {
		return fmt.Errorf("key %s/%s was left locked after the answer to the statement that took it was lost", held[0].Scope, held[0].Key)
	}
	return nil
}

// fired reports whether a rule with action a fired on the attempt.
func fired(rules []faultinject.Rule, inj *faultinject.Injector, a faultinject.Action) bool {
	for n, times := range inj.Fired() {
		if times > 0 && rules[n].Action == a {
			return true
		}
	}
	return false
}

// retryEvery sends the request every interval, concurrently, as a client
// whose earlier sends timed out would, until the returned function is
// called; that function returns the duplicates sent, for their verdicts.
func retryEvery(interval time.Duration, send func(ctx context.Context) (*atomicphase.Response, error)) func() []*duplicate {
	stop := make(chan struct{})
	done := make(chan []*duplicate)
	go func() {
		var sent []*duplicate
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-stop:
				done <- sent
				return
			case <-t.C:
				d := &duplicate{done: make(chan struct{})}
				go func() {
					defer close(d.done)
					d.resp, d.err = send(context.WithValue(context.Background(), dupKey{}, true))
				}()
				sent = append(sent, d)
			}
		}
	}()
	return func() []*duplicate {
		close(stop)
		return <-done
	}
}

// sweepOnce runs the sweep once, after ageing locks and backoffs as the
// passage of time would, turning an injected panic into an error as
// attemptOnce does. The resumed key's failures are the sweep's to count,
// not to return; the client's retry meets what they left.
func sweepOnce(ctx context.Context, db *DB, sweeper *atomicphase.Sweeper, lockTimeout time.Duration) (err error) {
	defer func() {
		if p := recover(); p != nil {
			ip, ok := p.(*faultinject.InjectedPanic)
			if !ok {
				panic(p)
			}
			err = fmt.Errorf("%s", ip)
		}
	}()
	if err := AgeLocks(ctx, db.Pool, lockTimeout); err != nil {
		return err
	}
	if err := keystore.AgeBackoffs(ctx, db.Pool, ""); err != nil {
		return err
	}
	_, err = sweeper.RunOnce(ctx)
	return err
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

// switchable lets the explorer change the injector, and the concurrent
// duplicate to send, between attempts of one Runner. The duplicate's own
// passes go to neither.
type switchable struct {
	inj atomic.Pointer[faultinject.Injector]
	dup atomic.Pointer[duplicate]
}

func (s *switchable) set(inj *faultinject.Injector, dup *duplicate) {
	s.inj.Store(inj)
	s.dup.Store(dup)
}

func (s *switchable) InjectFault(ctx context.Context, at atomicphase.FaultPoint, conn *pgx.Conn) error {
	if ctx.Value(dupKey{}) != nil {
		return nil
	}
	s.dup.Load().at(ctx, at)
	return s.inj.Load().InjectFault(ctx, at, conn)
}
