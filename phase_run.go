package atomicphase

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// cleanupTimeout bounds the unlock and rollback that follow a failed phase,
// which run even when the caller's context has ended.
const cleanupTimeout = 5 * time.Second

// attempt is one Run or Resume that holds a key's lock.
type attempt struct {
	r     *Runner
	wf    AnyWorkflow
	scope string
	key   string
	token int64
}

// phaseResult says where the workflow goes after a committed phase.
type phaseResult struct {
	resp  *Response // set when the phase responded
	next  int
	state []byte
}

// resume runs the workflow's phases from the key's recovery point until one
// responds or fails.
func (a *attempt) resume(ctx context.Context, row *keyRow) (resp *Response, err error) {
	a.token = row.LockToken
	if row.LockToken > 1 {
		a.r.log(ctx, slog.LevelInfo, "atomicphase: resuming key", "recovery_point", row.RecoveryPoint, "lock_token", row.LockToken)
	}
	defer func() {
		if p := recover(); p != nil {
			// Unlock so a retry can resume, then let the panic go on.
			if uerr := a.unlock(ctx); uerr != nil {
				a.r.log(ctx, slog.LevelError, "atomicphase: unlock after panic failed", "error", uerr)
			}
			panic(p)
		}
	}()
	if err := a.fault(ctx, "", AfterAcquire, nil); err != nil {
		return nil, a.fail(ctx, "", err)
	}
	var next string
	if row.NextPhase != nil {
		next = *row.NextPhase
	}
	idx, err := a.wf.resumeAt(row.RecoveryPoint, next)
	if err != nil {
		return nil, a.fail(ctx, "", err)
	}
	steps, state := a.wf.phaseSteps(), row.State
	for {
		if idx >= len(steps) {
			return nil, a.fail(ctx, row.RecoveryPoint, ErrNoResponse)
		}
		st := &steps[idx]
		res, err := a.runPhase(ctx, idx, st, state)
		if err != nil {
			return nil, a.fail(ctx, st.name, err)
		}
		if res.resp != nil {
			return res.resp, nil
		}
		idx, state = res.next, res.state
	}
}

// fail turns a phase failure into Run's error, unlocking the key unless the
// attempt crashed (a dead process unlocks nothing) or lost the lock (it is
// no longer ours to unlock).
func (a *attempt) fail(ctx context.Context, phase string, err error) error {
	switch {
	case errors.Is(err, ErrCrashed):
		return err
	case errors.Is(err, ErrLockLost):
		a.r.log(ctx, slog.LevelWarn, "atomicphase: lock lost to a newer attempt", "phase", phase)
	default:
		if uerr := a.unlock(ctx); uerr != nil {
			err = errors.Join(err, fmt.Errorf("unlock: %w", uerr))
		}
	}
	return &PhaseError{Workflow: a.wf.Name(), Phase: phase, Err: err}
}

func (a *attempt) unlock(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	return unlock(ctx, a.r.pool, a.scope, a.key, a.token)
}

// runPhase makes a foreign phase's call (once), then commits the phase,
// retrying its transaction on serialization failures and deadlocks.
func (a *attempt) runPhase(ctx context.Context, idx int, st *step, state []byte) (phaseResult, error) {
	if st.call != nil {
		// A foreign phase holds no connection before its call.
		if err := a.fault(ctx, st.name, BeforePhase, nil); err != nil {
			return phaseResult{}, err
		}
		fc := &ForeignCall{key: DownstreamKey(a.wf.Name(), a.scope, a.key, st.name)}
		out, err := st.call(ctx, fc, state)
		if ferr := a.fault(ctx, st.name, AfterForeign, nil); ferr != nil {
			return phaseResult{}, ferr
		}
		if fc.wasViolated() {
			err = ErrSecondForeignCall // even if the phase swallowed it
		}
		if err != nil {
			return phaseResult{}, err
		}
		state = out
	}
	for try := 0; ; try++ {
		res, err := a.commitPhase(ctx, idx, st, state)
		if err == nil || !retryableSQLState(err) || try >= a.r.cfg.PhaseRetries {
			return res, err
		}
		a.r.log(ctx, slog.LevelInfo, "atomicphase: retrying phase", "phase", st.name, "try", try+1, "error", err)
		if err := sleepJitter(ctx, a.r.cfg.RetryBackoff<<try); err != nil {
			return res, err
		}
	}
}

// commitPhase runs a phase's transaction on a connection of its own: the
// local function, then its recovery point, state and (when it responds)
// response, committed together. The connection is held only for this.
func (a *attempt) commitPhase(ctx context.Context, idx int, st *step, state []byte) (res phaseResult, err error) {
	pc, err := a.r.pool.Acquire(ctx)
	if err != nil {
		return res, err
	}
	ptx := newPhaseTx(pc.Conn(), st.isolation)
	committed := false
	defer func() {
		p := recover()
		switch {
		case errors.Is(err, ErrCrashed) && p == nil:
			crash(ctx, pc)
			return
		case !committed && ptx.begun():
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
			_ = ptx.rollback(cctx) // a broken connection is discarded by the pool
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
		if state, out, err = st.local(ctx, ptx, state); err == nil {
			err = ptx.err
		}
		if err != nil {
			return res, err
		}
	}
	res, point, next, err := a.route(idx, st, out, state)
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
	args := checkpointArgs(a.scope, a.key, a.token, point, next, state, res.resp)
	if ptx.begun() {
		// One round trip: the checkpoint raises if the lock token moved
		// on, and the server then skips the COMMIT queued behind it.
		b := &pgx.Batch{}
		b.Queue(checkpointSQL, args...)
		b.Queue("COMMIT")
		err = pc.SendBatch(ctx, b).Close()
	} else {
		// Nothing else was written: the checkpoint alone is atomic.
		_, err = pc.Exec(ctx, checkpointSQL, args...)
	}
	if err != nil {
		if isLockLost(err) {
			err = ErrLockLost
		}
		return res, err
	}
	committed = true
	return res, a.fault(ctx, st.name, AfterCommit, pc.Conn())
}

// route checks a phase's outcome and says what to store: the recovery point,
// the jump target, and where the workflow goes next.
func (a *attempt) route(idx int, st *step, out Outcome, state []byte) (res phaseResult, point, next string, err error) {
	res.state = state
	switch out.kind {
	case outcomeRespond:
		if out.resp.Status < 100 || out.resp.Status > 599 {
			return res, "", "", fmt.Errorf("phase responded with status %d; use 100-599", out.resp.Status)
		}
		resp := out.resp
		res.resp = &resp
		return res, RecoveryPointFinished, "", nil
	case outcomeJump:
		for _, t := range st.jumps {
			if t == out.target {
				res.next, _ = a.wf.resumeAt("", t)
				return res, st.name, t, nil
			}
		}
		return res, "", "", fmt.Errorf("phase jumped to %q, which it does not declare with WithJumps", out.target)
	default:
		if idx+1 >= len(a.wf.phaseSteps()) {
			return res, "", "", ErrNoResponse
		}
		res.next = idx + 1
		return res, st.name, "", nil
	}
}

func (a *attempt) fault(ctx context.Context, phase string, place FaultPlace, conn *pgx.Conn) error {
	if a.r.cfg.FaultInjector == nil {
		return nil
	}
	return a.r.cfg.FaultInjector.InjectFault(ctx, FaultPoint{Workflow: a.wf.Name(), Phase: phase, Place: place}, conn)
}

// crash leaves the connection as a killed process would: the socket is
// closed under the open transaction, with no COMMIT, ROLLBACK or unlock.
func crash(ctx context.Context, pc *pgxpool.Conn) {
	conn := pc.Hijack()
	_ = conn.PgConn().Conn().Close()
	_ = conn.Close(ctx)
}

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

func (r *Runner) log(ctx context.Context, level slog.Level, msg string, args ...any) {
	if r.cfg.Logger != nil {
		r.cfg.Logger.Log(ctx, level, msg, args...)
	}
}
