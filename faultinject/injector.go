package faultinject

import (
	"context"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase"
)

// Rule matches fault points and says what to do there. Empty Workflow and
// Phase match any.
type Rule struct {
	// Workflow is the workflow's name, or "" for any workflow.
	Workflow string
	// Phase is the phase's name, or "" for any phase (and for the places
	// around acquisition, which belong to no phase).
	Phase string
	// Place is the place in the run. Required.
	Place atomicphase.FaultPlace
	// Action is what to do there. Required.
	Action Action
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
	// HTTP is where DropAfterRequest breaks connections: the downstream
	// clients' transports must come from HTTP.Transport. Required for
	// DropAfterRequest.
	HTTP *HTTP

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
		if r.Action.NeedsConn() && !hasConn {
			// Nothing to act on here: the rule waits for a pass of its
			// point where the attempt holds a connection (BeforeAcquire
			// is passed without one before a new key's first unit, and
			// with one before a take).
			continue
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
		return sleep(ctx, r.Delay, 10*time.Millisecond)
	case SlowCall:
		return sleep(ctx, r.Delay, time.Second)
	case TerminateBackend:
		if conn == nil {
			return nil // no backend held here: nothing to kill
		}
		return i.terminate(ctx, conn)
	case LoseCommitAck, LoseTakeAck:
		if conn == nil {
			return nil
		}
		fc, ok := conn.PgConn().Conn().(*faultyConn)
		if !ok {
			return fmt.Errorf("faultinject: %s needs connections dialed through faultinject.InstallDialer", r.Action)
		}
		fc.loseNextAck()
		return nil
	case DropAfterRequest:
		if i.HTTP == nil {
			return fmt.Errorf("faultinject: %s needs Injector.HTTP", DropAfterRequest)
		}
		i.HTTP.dropNext()
		return nil
	case Exit:
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // SIGKILL cannot be caught; wait for it to land
	}
	return fmt.Errorf("faultinject: unknown action %q", r.Action)
}

// sleep waits d (def when 0), or until ctx ends.
func sleep(ctx context.Context, d, def time.Duration) error {
	if d == 0 {
		d = def
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// terminate kills conn's backend from another connection and waits until
// it is gone, so the next statement on conn meets a broken connection.
func (i *Injector) terminate(ctx context.Context, conn *pgx.Conn) error {
	if i.Admin == nil {
		return fmt.Errorf("faultinject: %s needs Injector.Admin", TerminateBackend)
	}
	pid := conn.PgConn().PID()
	if _, err := i.Admin.Exec(ctx, "SELECT pg_terminate_backend($1::integer)", int32(pid)); err != nil {
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
