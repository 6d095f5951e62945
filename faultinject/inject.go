// Package faultinject kills atomicphase runs at named fault points — in
// process and as a real process kill — and explores every point × action
// to prove that a workflow's invariants survive each one.
//
// A Runner passes fault points (atomicphase.FaultPoint) at fixed places:
// before and after the key is acquired, before each phase's body, after a
// foreign call returned, before the commit that stores the response, before
// each commit, and after it. An Injector set as Config.FaultInjector acts on
// the points its rules match:
//
//	inj := faultinject.New(faultinject.Rule{
//		Phase: "charge", Place: atomicphase.AfterForeign, Action: faultinject.Crash,
//	})
//	runner, _ := atomicphase.NewRunner(pool, &atomicphase.Config{FaultInjector: inj})
//
// Explore does this for every point a clean run passes and every action,
// each on a clean database, retrying like a client until a final answer and
// checking the scenario's invariants after each; see Scenario.
//
// For a server under an external test driver, FromEnv reads rules from
// ATOMICPHASE_FAULTS (see Parse), so `charge:after-foreign:exit` SIGKILLs the
// process right after the charge phase's foreign call returned.
package faultinject

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase"
)

// Action is what an Injector does at a matching fault point.
type Action string

// The actions.
const (
	// Crash stops the attempt dead, as a killed process would: its
	// connection is closed without commit, rollback or unlock, and Run
	// returns atomicphase.ErrCrashed. The key stays locked until the lock
	// timeout.
	Crash Action = "crash"
	// Error returns a transient error: the phase rolls back and the key is
	// unlocked.
	Error Action = "error"
	// Panic panics with an *InjectedPanic value; the Runner unlocks and re-panics.
	Panic Action = "panic"
	// Delay sleeps for Rule.Delay (default 10ms), for races and
	// lock-timeout tests.
	Delay Action = "delay"
	// TerminateBackend kills the connection's PostgreSQL backend from
	// another connection (pg_terminate_backend), so the driver meets a real
	// broken connection on its next statement. Only points where the
	// attempt holds a connection have a backend to kill.
	TerminateBackend Action = "terminate-backend"
	// LoseCommitAck lets the phase's COMMIT reach the server and complete,
	// then breaks the connection before the client reads the
	// acknowledgement: the ambiguous commit. It applies at BeforeCommit and
	// needs connections dialed through InstallDialer.
	LoseCommitAck Action = "lose-commit-ack"
	// Exit kills the whole process with SIGKILL at the point.
	Exit Action = "exit"
)

// Actions lists every action, in a stable order.
var Actions = []Action{Crash, Error, Panic, Delay, TerminateBackend, LoseCommitAck, Exit}

// InProcessActions are the actions an in-process explorer can survive
// (every one but Exit).
var InProcessActions = []Action{Crash, Error, Panic, Delay, TerminateBackend, LoseCommitAck}

// ErrInjected is wrapped by the error the Error action returns.
var ErrInjected = errors.New("faultinject: injected error")

// InjectedPanic is the value the Panic action panics with.
type InjectedPanic struct{ At atomicphase.FaultPoint }

// String names the point the panic was injected at.
func (p *InjectedPanic) String() string { return "faultinject: injected panic at " + p.At.String() }

// Rule matches fault points and says what to do there. Empty Workflow and
// Phase match any.
type Rule struct {
	Workflow string
	Phase    string
	Place    atomicphase.FaultPlace
	Action   Action
	// Delay is how long the Delay action sleeps. Defaults to 10ms.
	Delay time.Duration
	// Times is how many matching passes fire; later ones pass untouched.
	// Defaults to 1; a negative value fires on every pass.
	Times int
}

func (r *Rule) matches(at atomicphase.FaultPoint) bool {
	return r.Place == at.Place &&
		(r.Workflow == "" || r.Workflow == at.Workflow) &&
		(r.Phase == "" || r.Phase == at.Phase)
}

// Injector is an atomicphase.FaultInjector that applies rules and records
// every point it is passed. It is safe for concurrent use.
type Injector struct {
	// Admin is the pool TerminateBackend kills backends through; it may be
	// the Runner's own pool, since the kill runs on another of its
	// connections. Required for TerminateBackend.
	Admin *pgxpool.Pool

	mu     sync.Mutex
	rules  []Rule
	fired  []int
	passed []Passed
}

// Passed is a fault point an Injector saw, and whether the attempt held a
// connection there (which TerminateBackend and LoseCommitAck need).
type Passed struct {
	Point   atomicphase.FaultPoint
	HasConn bool
}

// New returns an Injector with rules.
func New(rules ...Rule) *Injector {
	return &Injector{rules: rules, fired: make([]int, len(rules))}
}

// Passed returns the points passed so far, in order, repeats included.
func (i *Injector) Passed() []Passed {
	i.mu.Lock()
	defer i.mu.Unlock()
	return append([]Passed(nil), i.passed...)
}

// Fired reports how many times each rule fired, in rule order.
func (i *Injector) Fired() []int {
	i.mu.Lock()
	defer i.mu.Unlock()
	return append([]int(nil), i.fired...)
}

// InjectFault implements atomicphase.FaultInjector. A nil *Injector (what
// FromEnv returns when no faults are configured) injects nothing.
func (i *Injector) InjectFault(ctx context.Context, at atomicphase.FaultPoint, conn *pgx.Conn) error {
	if i == nil {
		return nil
	}
	rule, ok := i.match(at, conn != nil)
	if !ok {
		return nil
	}
	return i.act(ctx, rule, at, conn)
}

func (i *Injector) match(at atomicphase.FaultPoint, hasConn bool) (Rule, bool) {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.passed = append(i.passed, Passed{Point: at, HasConn: hasConn})
	for n := range i.rules {
		r := &i.rules[n]
		times := r.Times
		if times == 0 {
			times = 1
		}
		if r.matches(at) && (times < 0 || i.fired[n] < times) {
			i.fired[n]++
			return *r, true
		}
	}
	return Rule{}, false
}

func (i *Injector) act(ctx context.Context, r Rule, at atomicphase.FaultPoint, conn *pgx.Conn) error {
	switch r.Action {
	case Crash:
		return fmt.Errorf("faultinject: crash at %s: %w", at, atomicphase.ErrCrashed)
	case Error:
		return fmt.Errorf("%w at %s", ErrInjected, at)
	case Panic:
		panic(&InjectedPanic{At: at})
	case Delay:
		d := r.Delay
		if d == 0 {
			d = 10 * time.Millisecond
		}
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	case TerminateBackend:
		if conn == nil {
			return nil // no backend held here: nothing to kill
		}
		return i.terminate(ctx, conn)
	case LoseCommitAck:
		if conn == nil {
			return nil
		}
		fc, ok := conn.PgConn().Conn().(*faultyConn)
		if !ok {
			return fmt.Errorf("faultinject: %s needs connections dialed through faultinject.InstallDialer", LoseCommitAck)
		}
		fc.loseNextAck()
		return nil
	case Exit:
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // SIGKILL cannot be caught; wait for it to land
	}
	return fmt.Errorf("faultinject: unknown action %q", r.Action)
}

// terminate kills conn's backend from another connection and waits until
// it is gone, so the next statement on conn meets a broken connection.
func (i *Injector) terminate(ctx context.Context, conn *pgx.Conn) error {
	if i.Admin == nil {
		return fmt.Errorf("faultinject: %s needs Injector.Admin", TerminateBackend)
	}
	pid := conn.PgConn().PID()
	if _, err := i.Admin.Exec(ctx, "SELECT pg_terminate_backend($1)", int32(pid)); err != nil {
		return fmt.Errorf("faultinject: pg_terminate_backend(%d): %w", pid, err)
	}
	for range 500 {
		var alive bool
		if err := i.Admin.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1)", int32(pid)).Scan(&alive); err != nil {
			return err
		}
		if !alive {
			return nil
		}
		time.Sleep(2 * time.Millisecond)
	}
	return fmt.Errorf("faultinject: backend %d still alive after pg_terminate_backend", pid)
}
