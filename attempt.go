package atomicphase

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime/debug"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// attempt is one Run or Resume that holds a key's lock. It is made only once
// acquisition has taken the key, from the row acquisition returned, and runs
// the key's workflow from the stored recovery point until a phase responds or
// fails.
type attempt struct {
	r     *Runner
	wf    AnyWorkflow
	scope string
	key   string
	// token is the lock token this acquisition got; every commit checks it.
	token int64
	// salt is the key row's downstream salt ("" on rows older than it).
	salt string
	// attempts counts the acquisitions of the key, this one included.
	attempts int
	// fresh is true while no earlier attempt can have called the phase
	// about to run: the key was recorded by this attempt, or this attempt
	// committed the phase before it. A phase with a reconcile function is
	// reconciled first unless fresh.
	fresh bool
	// resolve, when set, stands in for the reconcile function of the first
	// phase this attempt resumes into (ResolveUnknown).
	resolve func(state []byte) (bool, []byte, error)
	// resumedFrom is the recovery point the attempt resumed at, which an
	// operator's recorded verdict names (Runner.RecordResolution).
	resumedFrom string
}

// newAttempt makes the attempt for a key acquisition took, from the row it
// returned.
func newAttempt(r *Runner, wf AnyWorkflow, scope, key string, row *keyRow) *attempt {
	// attempts is 1 only for the acquisition that recorded the key: a
	// takeover or a Resume counts on from the row's own count.
	a := &attempt{r: r, wf: wf, scope: scope, key: key, token: row.LockToken, attempts: row.Attempts, fresh: row.Attempts == 1,
		resumedFrom: row.RecoveryPoint}
	if row.DownstreamSalt != nil {
		a.salt = *row.DownstreamSalt
	}
	return a
}

// phaseResult says where the workflow goes after a committed phase.
type phaseResult struct {
	resp    *Response // set when the phase responded
	nextIdx int       // the index of the phase to run next
	state   []byte
}

// run runs the workflow's phases from the row's recovery point until one
// responds or fails.
func (a *attempt) run(ctx context.Context, row *keyRow) (resp *Response, err error) {
	if row.RecoveryPoint != RecoveryPointStarted {
		a.log(ctx, slog.LevelInfo, "atomicphase: resuming key", "recovery_point", row.RecoveryPoint, "attempt", a.attempts)
	}
	defer func() {
		if p := recover(); p != nil {
			// A panic is a bug that a retry would meet again: park the key
			// with the panic and its stack, where an operator sees it, then
			// let the panic go on. A client retry still resumes it (after
			// the fix, say).
			why := fmt.Errorf("panic: %v\n%s", p, debug.Stack())
			if released, perr := a.r.release(ctx, a.scope, a.key, a.token, why, 0, true, false); perr != nil {
				a.log(ctx, slog.LevelError, "atomicphase: parking after a panic failed", "error", perr)
			} else if released {
				a.r.observe(ctx, Event{Kind: EventParked, Workflow: a.wf.Name(), Scope: a.scope, Key: a.key, Err: why})
			}
			panic(p)
		}
	}()
	if err := a.fault(ctx, "", AfterAcquire, nil); err != nil {
		return nil, a.fail(ctx, "", err)
	}
	var jumpTarget string
	if row.JumpTarget != nil {
		jumpTarget = *row.JumpTarget
	}
	idx, err := a.wf.resumeAt(row.RecoveryPoint, jumpTarget)
	if err != nil {
		return nil, a.fail(ctx, "", Permanent(err))
	}
	steps, state := a.wf.phaseSteps(), row.State
	for {
		if idx >= len(steps) {
			return nil, a.fail(ctx, row.RecoveryPoint, Permanent(ErrNoResponse))
		}
		st := &steps[idx]
		res, err := a.observedPhase(ctx, idx, st, state)
		if err != nil {
			return nil, a.fail(ctx, st.name, err)
		}
		if res.resp != nil {
			return res.resp, nil
		}
		idx, state = res.nextIdx, res.state
		a.fresh = true // this attempt committed the phase before the next one
	}
}

// observedPhase runs a phase under its span and reports how it ended.
func (a *attempt) observedPhase(ctx context.Context, idx int, st *step, state []byte) (phaseResult, error) {
	if a.r.cfg.Observer == nil {
		return a.runPhase(ctx, idx, st, state)
	}
	start := time.Now()
	ctx, end := a.r.span(ctx, Span{Kind: SpanPhase, Workflow: a.wf.Name(), Scope: a.scope, Key: a.key, Phase: st.name})
	defer func() {
		if p := recover(); p != nil {
			err := fmt.Errorf("panic: %v", p)
			a.r.observe(ctx, Event{Kind: EventPhaseFailed, Workflow: a.wf.Name(), Scope: a.scope, Key: a.key, Phase: st.name, Duration: time.Since(start), Err: err})
			end(err)
			panic(p)
		}
	}()
	res, err := a.runPhase(ctx, idx, st, state)
	e := Event{Kind: EventPhaseCommitted, Workflow: a.wf.Name(), Scope: a.scope, Key: a.key, Phase: st.name, Duration: time.Since(start)}
	if err != nil {
		e.Kind, e.Err = EventPhaseFailed, err
	}
	a.r.observe(ctx, e) // while the phase's span is open
	end(err)
	return res, err
}

// runPhase makes a foreign phase's call (once), then commits the phase,
// retrying its transaction on serialization failures and deadlocks.
func (a *attempt) runPhase(ctx context.Context, idx int, st *step, state []byte) (phaseResult, error) {
	if st.call != nil {
		// A foreign phase holds no connection before its call.
		if err := a.fault(ctx, st.name, BeforePhase, nil); err != nil {
			return phaseResult{}, err
		}
		key := downstreamKey(a.salt, a.wf.Name(), a.scope, a.key, st.downstreamName)
		// The reconcile function gets a guard of its own, so that a lookup
		// made through it leaves the call's one claim unspent.
		out, happened, err := a.reconcile(ctx, st, newForeignCall(key), state)
		if err != nil {
			return phaseResult{}, err
		}
		if !happened {
			fc := newForeignCall(key)
			out, err = st.call(ctx, fc, state)
			if ferr := a.fault(ctx, st.name, AfterForeign, nil); ferr != nil {
				if st.reconcile != nil && !errors.Is(ferr, ErrCrashed) {
					// Whatever failed after the call, it may have gone out.
					ferr = outcomeUnknown(ferr)
					a.r.observe(ctx, Event{Kind: EventUnknown, Workflow: a.wf.Name(), Scope: a.scope, Key: a.key, Phase: st.name, Err: ferr})
				}
				return phaseResult{}, ferr
			}
			if fc.wasViolated() {
				err = Permanent(ErrSecondForeignCall) // even if the phase swallowed it
			}
			if err != nil && st.reconcile != nil && !errors.Is(err, ErrPermanent) {
				// The call may have gone out: nothing may repeat it now
				// before reconciliation tells.
				err = outcomeUnknown(err)
				a.r.observe(ctx, Event{Kind: EventUnknown, Workflow: a.wf.Name(), Scope: a.scope, Key: a.key, Phase: st.name, Err: err})
			}
			if err != nil {
				return phaseResult{}, err
			}
		}
		state = out
	}
	for try := 0; ; try++ {
		res, err := a.commitPhase(ctx, idx, st, state)
		if isDataError(err) {
			// The same input meets the same refusal on every retry.
			return res, Permanent(err)
		}
		if err == nil || !isConflict(err) || try >= a.r.cfg.PhaseRetries {
			return res, err
		}
		a.log(ctx, slog.LevelInfo, "atomicphase: retrying phase", "phase", st.name, "try", try+1, "error", err)
		if err := sleepJitter(ctx, a.r.cfg.retryBackoff(try)); err != nil {
			return res, err
		}
	}
}

// runnable reports whether this process's workflow has the phase the row
// resumes at.
func (a *attempt) runnable(row *keyRow) bool {
	var jumpTarget string
	if row.JumpTarget != nil {
		jumpTarget = *row.JumpTarget
	}
	_, err := a.wf.resumeAt(row.RecoveryPoint, jumpTarget)
	return err == nil
}

// acceptResolution checks that the attempt resumes into a phase of
// workflow that has a reconcile function, for ResolveUnknown.
func (a *attempt) acceptResolution(row *keyRow, workflow string) error {
	if row.Workflow != workflow {
		return fmt.Errorf("%w: the key belongs to workflow %q, not %q", ErrNotUnknown, row.Workflow, workflow)
	}
	var jumpTarget string
	if row.JumpTarget != nil {
		jumpTarget = *row.JumpTarget
	}
	idx, err := a.wf.resumeAt(row.RecoveryPoint, jumpTarget)
	steps := a.wf.phaseSteps()
	if err != nil || idx >= len(steps) || steps[idx].reconcile == nil {
		return fmt.Errorf("%w: it resumes after %q", ErrNotUnknown, row.RecoveryPoint)
	}
	return nil
}

// reconcile asks whether the call of st, a phase with a reconcile function
// that this attempt resumed into, took effect before: it returns the state
// with the call's result and happened true when it did, false when the call
// must be made, and an error wrapping ErrOutcomeUnknown when it cannot
// tell. A fresh attempt, or a phase whose downstream has idempotency keys,
// needs no reconciling.
func (a *attempt) reconcile(ctx context.Context, st *step, fc *ForeignCall, state []byte) ([]byte, bool, error) {
	if st.reconcile == nil || a.fresh {
		return nil, false, nil
	}
	e := Event{Workflow: a.wf.Name(), Scope: a.scope, Key: a.key, Phase: st.name}
	var happened bool
	var out []byte
	var err error
	verdict, err := a.takeVerdict(ctx)
	if err != nil {
		return nil, false, err
	}
	switch {
	case a.resolve != nil:
		happened, out, err = a.resolve(state)
		a.resolve = nil
	case verdict != nil && !*verdict:
		happened = false // an operator checked: it did not happen
	default:
		happened, out, err = st.reconcile(ctx, fc, state)
		if verdict != nil && (err != nil || !happened) {
			// An operator checked: it happened. The reconcile function
			// could not add the result; go on with the state as it is.
			happened, out, err = true, state, nil
		}
	}
	switch {
	case err != nil:
		e.Kind, e.Err = EventReconcileFailed, err
		a.r.observe(ctx, e)
		if errors.Is(err, ErrPermanent) {
			return nil, false, err
		}
		return nil, false, outcomeUnknown(fmt.Errorf("reconcile: %w", err))
	case happened:
		e.Kind = EventReconcileHappened
	default:
		e.Kind = EventReconcileNotHappened
	}
	a.r.observe(ctx, e)
	return out, happened, nil
}

// takeVerdictSQL takes, once, an operator's verdict recorded for the phase
// after the recovery point this attempt resumed at.
const takeVerdictSQL = `
UPDATE /* TEMPLATE: schema */idempotency_keys SET resolved_after = NULL
WHERE scope = $1 AND idempotency_key = $2 AND lock_token = $3 AND resolved_after = $4
RETURNING resolved_happened`

// takeVerdict returns the operator's verdict on the call this attempt
// resumed into (Runner.RecordResolution), or nil when none was recorded.
// It costs a round trip, on the rare path of an attempt that resumes into
// a phase with a reconcile function.
func (a *attempt) takeVerdict(ctx context.Context) (*bool, error) {
	var happened bool
	err := a.r.pool.QueryRow(ctx, renderSQL(takeVerdictSQL, a.r.cfg.Schema), a.scope, a.key, a.token, a.resumedFrom).Scan(&happened)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &happened, nil
}

// commitPhase runs a phase's transaction on a connection of its own: the
// local function, then its checkpoint (recovery point, state and, when it
// responds, response), committed together. The connection is held only for
// this.
func (a *attempt) commitPhase(ctx context.Context, idx int, st *step, state []byte) (res phaseResult, err error) {
	pc, err := a.r.pool.Acquire(ctx)
	if err != nil {
		return res, err
	}
	tx := newPhaseTx(pc.Conn(), st.isolation)
	committed := false
	defer func() {
		p := recover()
		switch {
		case errors.Is(err, ErrCrashed) && p == nil:
			crash(ctx, pc)
			return
		case !committed && tx.begun():
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
			_ = tx.rollback(cctx) // a broken connection is discarded by the pool
			cancel()
		}
		pc.Release()
		if p != nil {
			panic(p)
		}
	}()

	if st.call == nil {
		// A local phase's body is about to run on this connection.
		if err := a.fault(ctx, st.name, BeforePhase, pc.Conn()); err != nil {
			return res, err
		}
	}
	out := Outcome{}
	if st.local != nil {
		if state, out, err = st.local(ctx, tx, state); err == nil {
			err = tx.err
		}
		if err != nil {
			return res, err
		}
	}
	res, cp, err := a.route(idx, st, out, state)
	if err != nil {
		return res, err
	}
	if res.resp != nil {
		if err := a.fault(ctx, st.name, BeforeResponse, pc.Conn()); err != nil {
			return res, err
		}
	}
	if err := a.fault(ctx, st.name, BeforeCommit, pc.Conn()); err != nil {
		return res, err
	}
	if err := a.commit(ctx, pc.Conn(), tx, cp); err != nil {
		return res, err
	}
	committed = true
	return res, a.fault(ctx, st.name, AfterCommit, pc.Conn())
}

// route checks a phase's outcome and says where the workflow goes next and
// what the phase's commit stores.
func (a *attempt) route(idx int, st *step, out Outcome, state []byte) (phaseResult, *checkpoint, error) {
	res := phaseResult{state: state}
	switch out.kind {
	case outcomeRespond:
		if out.resp.Status < 200 || out.resp.Status > 599 {
			return res, nil, Permanent(fmt.Errorf("phase responded with status %d; a final response is 200-599", out.resp.Status))
		}
		resp := out.resp
		res.resp = &resp
		cp := &checkpoint{point: RecoveryPointFinished, resp: &resp}
		if a.wf.keepsFinishedState() {
			cp.state = state
		}
		return res, cp, nil
	case outcomeJump:
		for _, t := range st.jumps {
			if t == out.target {
				res.nextIdx, _ = a.wf.resumeAt("", t)
				return res, &checkpoint{point: st.name, jumpTarget: t, state: state}, nil
			}
		}
		return res, nil, Permanent(fmt.Errorf("phase jumped to %q, which it does not declare with WithJumps", out.target))
	default:
		if idx+1 >= len(a.wf.phaseSteps()) {
			return res, nil, Permanent(ErrNoResponse)
		}
		res.nextIdx = idx + 1
		return res, &checkpoint{point: st.name, state: state}, nil
	}
}

// fail turns a phase failure into Run's error and releases the key, except
// when the attempt crashed (a dead process releases nothing) or lost the
// lock (it is no longer ours). A permanent failure, or a failure of the
// key's last allowed attempt (Config.MaxAttempts), parks the key; any other
// failure records the error and when the sweep may try the key again.
func (a *attempt) fail(ctx context.Context, phase string, err error) error {
	parked := false
	switch {
	case errors.Is(err, ErrCrashed):
		return err
	case errors.Is(err, ErrLockLost):
		a.log(ctx, slog.LevelWarn, "atomicphase: lock lost to a newer attempt", "phase", phase)
		a.r.observe(ctx, Event{Kind: EventLockLost, Workflow: a.wf.Name(), Scope: a.scope, Key: a.key, Phase: phase})
	default:
		why := fmt.Errorf("phase %q: %w", phase, err)
		if phase == "" {
			why = err
		}
		park := errors.Is(err, ErrPermanent) || a.attempts >= a.r.cfg.MaxAttempts
		if park && !errors.Is(err, ErrPermanent) {
			why = fmt.Errorf("attempt %d of %d failed: %w", a.attempts, a.r.cfg.MaxAttempts, why)
		}
		unknown := errors.Is(err, ErrOutcomeUnknown)
		released, rerr := a.r.release(ctx, a.scope, a.key, a.token, why, a.r.cfg.attemptBackoff(a.attempts), park, unknown)
		switch {
		case rerr != nil:
			err = errors.Join(err, fmt.Errorf("unlock: %w", rerr))
		case !released:
			// Another attempt took the key (it is its to answer for now),
			// or finished it: nothing was parked or marked.
			a.log(ctx, slog.LevelWarn, "atomicphase: lock lost to a newer attempt", "phase", phase, "error", err)
			a.r.observe(ctx, Event{Kind: EventLockLost, Workflow: a.wf.Name(), Scope: a.scope, Key: a.key, Phase: phase})
			err = fmt.Errorf("%w (the attempt had failed: %v)", ErrLockLost, err)
		case park:
			parked = true
			a.log(ctx, slog.LevelError, "atomicphase: key parked", "phase", phase, "error", why)
			a.r.observe(ctx, Event{Kind: EventParked, Workflow: a.wf.Name(), Scope: a.scope, Key: a.key, Phase: phase, Err: why})
		case unknown:
			a.r.observe(ctx, Event{Kind: EventReconcileScheduled, Workflow: a.wf.Name(), Scope: a.scope, Key: a.key, Phase: phase, Err: err})
		}
	}
	return &PhaseError{Workflow: a.wf.Name(), Phase: phase, Err: err, Parked: parked}
}

// log logs msg about this attempt's key.
func (a *attempt) log(ctx context.Context, level slog.Level, msg string, args ...any) {
	a.r.logKey(ctx, level, msg, a.wf.Name(), a.scope, a.key, args...)
}

// fault passes the fault point place of phase (see Config.FaultInjector).
func (a *attempt) fault(ctx context.Context, phase string, place FaultPlace, conn *pgx.Conn) error {
	return a.r.fault(ctx, a.wf.Name(), phase, place, conn)
}

// crash leaves the connection as a killed process would: the socket is
// closed under the open transaction, with no COMMIT, ROLLBACK or unlock.
func crash(ctx context.Context, pc *pgxpool.Conn) {
	conn := pc.Hijack()
	_ = conn.PgConn().Conn().Close()
	_ = conn.Close(ctx)
}

// sleepJitter sleeps a random duration in [0, ceiling), or until ctx ends.
func sleepJitter(ctx context.Context, ceiling time.Duration) error {
	t := time.NewTimer(rand.N(max(ceiling, 1)))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
