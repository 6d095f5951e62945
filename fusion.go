package atomicphase

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/atomicphase/atomicphase/internal/keystore"
)

// Phase fusion. A workflow's phases run in units: one unit is one database
// transaction and one commit. A unit begins with a local phase, or with a
// foreign phase's record step (its call made, outside any transaction, just
// before), and the local phases that follow join it, up to the next foreign
// phase or the phase that responds; the new key's recording joins the
// workflow's first unit when the workflow begins with a local phase. So a
// request commits once per foreign phase, plus once, and a foreign call
// always goes out with everything before it committed. A unit's commit
// stores the recovery point of its last phase: a crash inside a unit rolls
// the whole unit back, and the retry runs it again from its first phase
// (for a foreign phase's record step: from the call, repeated with the
// same downstream key or reconciled, never blindly repeated). A phase
// joins only at the unit's isolation level, and not at all when
// WorkflowOpts.CommitEachPhase is set.

// phaseRun is one run of one phase: its span and when it began.
type phaseRun struct {
	ctx   context.Context // the phase's span's context
	name  string
	start time.Time
	end   func(error)
}

// startPhase opens the span of a phase run.
func (a *attempt) startPhase(ctx context.Context, st *step) phaseRun {
	if a.r.cfg.Observer == nil {
		return phaseRun{ctx: ctx, name: st.name, end: noEnd}
	}
	ctx, end := a.r.span(ctx, Span{Kind: SpanPhase, Workflow: a.wf.Name(), Scope: a.scope, Key: a.key, Phase: st.name})
	return phaseRun{ctx: ctx, name: st.name, start: time.Now(), end: end}
}

// committed reports the phase committed and ends its span.
func (a *attempt) committed(pr phaseRun) {
	if a.r.cfg.Observer == nil {
		return
	}
	a.r.observe(pr.ctx, Event{Kind: EventPhaseCommitted, Workflow: a.wf.Name(), Scope: a.scope, Key: a.key, Phase: pr.name, Duration: time.Since(pr.start)})
	pr.end(nil)
}

// failed reports the phase failed and ends its span.
func (a *attempt) failed(pr phaseRun, err error) {
	if a.r.cfg.Observer == nil {
		return
	}
	if errors.Is(err, keystore.ErrNotRecorded) {
		// The key was another's (the phase ran before that was known,
		// queued behind the key's read): no phase of this request failed.
		pr.end(ErrDiscarded)
		return
	}
	a.r.observe(pr.ctx, Event{Kind: EventPhaseFailed, Workflow: a.wf.Name(), Scope: a.scope, Key: a.key, Phase: pr.name, Duration: time.Since(pr.start), Err: err})
	pr.end(err)
}

// endRolledBack ends the spans of phases that rolled back with the failed
// phase of their transaction: they neither committed nor failed themselves.
func endRolledBack(ran []phaseRun, failed string) {
	for _, done := range ran {
		done.end(fmt.Errorf("atomicphase: rolled back with phase %q, which shares its transaction", failed))
	}
}

// unitError is a unit's failure, charged to the phase it happened in.
type unitError struct {
	phase string
	err   error
	// mayHaveCommitted is set when the unit's transaction committed, or
	// may have (its commit's answer was lost): nothing of it may then be
	// committed again.
	mayHaveCommitted bool
	// driverErr and connLost tell where err came from (see classify).
	driverErr error
	connLost  bool
}

// loop runs the workflow from phase idx with state, unit by unit, until a
// phase responds or fails.
func (a *attempt) loop(ctx context.Context, idx int, state []byte) (*Response, error) {
	steps := a.wf.phaseSteps()
	for {
		if idx >= len(steps) {
			return nil, a.fail(ctx, steps[len(steps)-1].name, Permanent(ErrNoResponse))
		}
		st := &steps[idx]
		pr := a.startPhase(ctx, st)
		if st.call != nil {
			out, err := a.callPhase(pr.ctx, st, state)
			if err != nil {
				a.failed(pr, err)
				return nil, a.fail(ctx, st.name, err)
			}
			state = out
		}
		res, uerr := a.runUnit(ctx, idx, state, pr)
		if uerr != nil {
			return a.failUnit(ctx, idx, state, uerr)
		}
		if res.resp != nil {
			return res.resp, nil
		}
		idx, state = res.nextIdx, res.state
		a.fresh = true // this attempt committed the phase before the next one
	}
}

// failUnit fails the attempt after a unit failed. When the unit also held
// the key's recording, or a foreign phase's record step followed by other
// phases, that part is committed on its own first (a failure must not cost
// what went before it: the key's row, which keeps the failure, and a
// call's result, which must not be asked for again). When the key turns
// out to be another attempt's, the failed run was never this attempt's to
// make: keystore.ErrNotRecorded sends the request through acquisition again, which
// explains the key as it is. A failure that refused the request's own data
// ends the request with its final answer instead (answerRefusal).
func (a *attempt) failUnit(ctx context.Context, first int, state []byte, ue *unitError) (*Response, error) {
	var missing *keystore.StoreMissingError
	if errors.Is(ue.err, keystore.ErrNotRecorded) || errors.Is(ue.err, ErrCrashed) || errors.As(ue.err, &missing) {
		// (No key store: nothing ran, nothing is recorded; the request
		// fails closed, runNew says so.)
		return nil, ue.err
	}
	switch ours, err := a.recordAlone(ctx); {
	case err != nil:
		a.log(ctx, slog.LevelWarn, "atomicphase: recording a failed attempt's key failed", "error", err)
		// Its answer may be what was lost: unlock by the token, best effort.
		_ = a.r.unlock(ctx, a.scope, a.key, a.token)
		return nil, ue.err
	case !ours:
		return nil, keystore.ErrNotRecorded
	}
	steps := a.wf.phaseSteps()
	if st := &steps[first]; st.call != nil && ue.phase != st.name && !ue.mayHaveCommitted && !errors.Is(ue.err, ErrLockLost) {
		// Even when ctx has ended: the call went out, and its result is
		// worth keeping.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		pr := a.startPhase(cctx, st)
		if _, err := a.unit(cctx, first, state, pr, false); err != nil {
			a.log(ctx, slog.LevelWarn, "atomicphase: recording a call's result on its own failed", "phase", st.name, "error", err.err)
		}
	}
	var refused *dataRefusedError
	if errors.As(ue.err, &refused) {
		if a.paid {
			// A foreign phase's call may have gone out (callPhase, or an
			// earlier attempt's: mayHaveCalled), whether its result
			// committed or this unit was to record it: a new key for a
			// corrected request would pay again. The refusal is a bug in the
			// workflow, for an operator to fix and unpark.
			return nil, a.fail(ctx, ue.phase, Permanent(&paidRefusalError{refused}))
		}
		return a.answerRefusal(ctx, ue.phase, state, refused)
	}
	return nil, a.fail(ctx, ue.phase, ue.err)
}

// recordAlone records the key on its own when the transaction that was to
// record it did not commit, so that a failure is kept on the key's row (and
// an attempt whose commit answer was lost finds its row). It reports
// whether the key is this attempt's: recorded by it now or before, under
// its lock token. A key already recorded by another attempt is left as it
// was found.
func (a *attempt) recordAlone(ctx context.Context) (ours bool, err error) {
	rec := a.rec
	if rec == nil {
		return true, nil
	}
	a.rec = nil
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	// The recording again, on its own: it records nothing when the key
	// exists, whoever recorded it.
	sent := time.Now() // a recording starts the lease no earlier
	err = rec.RecordAgain(ctx, a.r.poolFor(a.scope))
	if err == nil || a.leaseFrom.IsZero() {
		// (A key recorded before by this attempt was recorded by a commit
		// whose answer was lost, which set leaseFrom when it was sent.)
		a.leaseFrom = sent
	}
	switch {
	case errors.Is(err, keystore.ErrNotRecorded):
		// Recorded before: by this attempt, in a commit whose answer was
		// lost, if the key holds its lock token (and not at all when it
		// was recorded and is gone again: forgotten, reaped).
		ours, _, err = a.r.store.OwnedBy(ctx, a.r.poolFor(a.scope), a.scope, a.key, a.token)
		return ours, err
	case err != nil:
		return false, err
	}
	if !rec.Announced {
		rec.Announced = true
		a.r.observe(ctx, Event{Kind: EventCreated, Workflow: a.wf.Name(), Scope: a.scope, Key: a.key})
	}
	a.salt = rec.Salt
	return true, nil
}

// runUnit runs the unit that begins at phase idx, retrying its transaction
// on serialization failures and deadlocks (from its first phase, with the
// state it began with).
func (a *attempt) runUnit(ctx context.Context, idx int, state []byte, first phaseRun) (phaseResult, *unitError) {
	for try := 0; ; try++ {
		res, ue := a.unit(ctx, idx, state, first, true)
		var missing *keystore.StoreMissingError
		if ue == nil || errors.Is(ue.err, keystore.ErrNotRecorded) || errors.As(ue.err, &missing) {
			return res, ue
		}
		switch a.classifyUnit(ue) {
		case classRequest:
			// The same input meets the same refusal on every retry.
			ue.err = &dataRefusedError{err: ue.err}
			return res, ue
		case classPermanent:
			ue.err = Permanent(diagnose(ue.err, ue.driverErr))
			return res, ue
		case classTransient:
			return res, ue
		}
		if try >= a.r.cfg.PhaseRetries {
			return res, ue
		}
		a.log(ctx, slog.LevelInfo, "atomicphase: retrying phase", "phase", ue.phase, "try", try+1, "error", ue.err)
		if err := sleepJitter(ctx, a.r.cfg.retryBackoff(try)); err != nil {
			return res, &unitError{phase: ue.phase, err: err}
		}
		first = a.startPhase(ctx, &a.wf.phaseSteps()[idx])
	}
}

// unit runs one unit: phase idx (whose call, for a foreign phase, is made)
// and, when fuse is set, the local phases that join it, in one transaction
// on a connection of its own, committed with the last phase's checkpoint.
// The connection is held only for this.
func (a *attempt) unit(ctx context.Context, idx int, state []byte, pr phaseRun, fuse bool) (res phaseResult, ue *unitError) {
	steps := a.wf.phaseSteps()
	var l *lease
	if a.rec == nil {
		// The key is recorded: renew its lease while the unit runs. (A key
		// riding unrecorded in this transaction is no other attempt's to
		// take.)
		lctx := ctx
		l, lctx, _ = a.hold(ctx, false)
		defer l.release()
		pr.ctx = underLease(pr.ctx, ctx, lctx)
		ctx = lctx
	}
	pc := a.conn
	a.conn = nil
	if pc == nil {
		var err error
		if pc, err = a.r.poolFor(a.scope).Acquire(ctx); err != nil {
			a.failed(pr, err)
			return res, &unitError{phase: pr.name, err: err}
		}
	}
	tx := newPhaseTx(pc.Conn(), steps[idx].isolation)
	if tx.rec = a.rec; tx.rec != nil {
		tx.rec.Sent, tx.rec.Recorded = false, false
		tx.assumed = a.assumed
	}
	var ran []phaseRun // phases of this unit whose functions are done
	committed := false
	defer func() {
		p := recover()
		if p != nil {
			a.failed(pr, fmt.Errorf("panic: %v", p))
			endRolledBack(ran, pr.name)
		}
		switch {
		case ue != nil && errors.Is(ue.err, ErrCrashed) && p == nil:
			crash(ctx, pc)
			return
		case !committed && tx.begun():
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
			_ = tx.rollback(cctx) // a broken connection is discarded by the pool
			cancel()
		case !committed && ue != nil && len(tx.named) > 0 && !errors.Is(ue.err, keystore.ErrNotRecorded):
			// An assumed batch that failed for another reason than its
			// key (assume_prepare.go).
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
			tx.forgetNamed(cctx)
			cancel()
		}
		pc.Release()
		if p != nil {
			panic(p)
		}
	}()
	fail := func(phase string, err error) (phaseResult, *unitError) {
		var qe *queuedError
		if errors.As(err, &qe) {
			phase = qe.phase
		}
		if a.rec != nil && a.rec.Sent && !a.rec.Recorded {
			err = keystore.ErrNotRecorded
		}
		a.failed(pr, err)
		endRolledBack(ran, pr.name)
		return res, &unitError{phase: phase, err: err, driverErr: tx.driverErr, connLost: pc.Conn().IsClosed()}
	}

	for cur := idx; ; {
		st := &steps[cur]
		tx.phase = st.name
		if st.call == nil {
			// A local phase's body is about to run on this connection.
			if err := a.fault(pr.ctx, st.name, BeforePhase, pc.Conn()); err != nil {
				return fail(st.name, err)
			}
		}
		out := Outcome{}
		if st.local != nil {
			var err error
			pctx, cancel := a.bound(pr.ctx)
			state, out, err = st.local(pctx, tx, state)
			err = tx.end(err)
			cancel()
			if err != nil && l != nil {
				err = leaseCause(l, err)
			}
			if err != nil {
				return fail(st.name, err)
			}
		}
		var cp *checkpoint
		var err error
		if res, cp, err = a.route(cur, st, out, state); err != nil {
			return fail(st.name, err)
		}
		if fuse && res.resp == nil && joins(&steps[res.nextIdx], tx) {
			ran = append(ran, pr)
			cur, state = res.nextIdx, res.state
			pr = a.startPhase(ctx, &steps[cur])
			continue
		}
		if res.resp != nil {
			if err := a.fault(pr.ctx, st.name, BeforeResponse, pc.Conn()); err != nil {
				return fail(st.name, err)
			}
		}
		if err := a.fault(pr.ctx, st.name, BeforeCommit, pc.Conn()); err != nil {
			return fail(st.name, err)
		}
		if l != nil {
			// Nothing is committed past the lease.
			if err := l.end(); err != nil {
				return fail(st.name, err)
			}
		}
		cctx, cancel := a.bound(pr.ctx)
		err = a.commit(cctx, pc.Conn(), tx, cp)
		cancel()
		if err != nil {
			res, ue := fail(st.name, err)
			ue.mayHaveCommitted = answerMayBeLost(err)
			return res, ue
		}
		committed = true
		if rec := a.rec; rec != nil {
			// The key is recorded now, not when its INSERT answered: a
			// transaction that rolls back records nothing.
			a.salt = rec.Salt
			a.rec = nil
			if !rec.Announced {
				rec.Announced = true
				a.r.observe(ctx, Event{Kind: EventCreated, Workflow: a.wf.Name(), Scope: a.scope, Key: a.key})
			}
		}
		for _, done := range ran {
			a.committed(done)
		}
		a.committed(pr)
		if err := a.fault(ctx, st.name, AfterCommit, pc.Conn()); err != nil {
			return res, &unitError{phase: st.name, err: err, mayHaveCommitted: true}
		}
		return res, nil
	}
}

// underLease returns the context a unit's first phase runs under, also
// ended with the unit's lease: lctx itself when the phase's context is the
// unit's own (no Observer opened a span), else the span's context, linked.
func underLease(phaseCtx, unitCtx, lctx context.Context) context.Context {
	if phaseCtx == unitCtx {
		return lctx
	}
	c, cancel := context.WithCancelCause(phaseCtx)
	context.AfterFunc(lctx, func() { cancel(context.Cause(lctx)) })
	return c
}

// joins reports whether phase next joins the unit whose transaction is tx:
// a local phase at the unit's isolation level does.
func joins(next *step, tx *phaseTx) bool {
	return next.call == nil && !next.alone && next.isolation == tx.opts.IsoLevel
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
