package atomicphase

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/atomicphase/atomicphase/internal/keystore"
)

// Reconciliation: an attempt that resumes into a phase with a reconcile
// function asks first whether an earlier attempt's call took effect. The
// answer comes, in order, from ResolveUnknown's resolve function, from an
// operator's verdict (Runner.RecordResolution), or from the phase's
// reconcile function; a call found to have happened is not made again.

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
	verdict, result, err := a.takeVerdict(ctx)
	if err != nil {
		return nil, false, err
	}
	if verdict != nil && *verdict {
		fc.operatorResult = result
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

// takeVerdict returns the operator's verdict on the call this attempt
// resumed into (Runner.RecordResolution), or nil when none was recorded,
// and the call's result it came with (RecordResolutionWithResult). It
// costs a round trip, on the rare path of an attempt that resumes into a
// phase with a reconcile function.
func (a *attempt) takeVerdict(ctx context.Context) (*bool, []byte, error) {
	return a.r.store.TakeVerdict(ctx, a.r.poolFor(a.scope), a.scope, a.key, a.token, a.resumedFrom)
}

// acceptResolution checks that the attempt resumes into a phase of
// workflow that has a reconcile function, for ResolveUnknown.
func (a *attempt) acceptResolution(row *keystore.Row, workflow string) error {
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

// ErrNotUnknown is returned by ResolveUnknown for a key that is not waiting
// at a phase with a reconcile function: there is nothing to resolve.
var ErrNotUnknown = errors.New("atomicphase: key is not waiting to reconcile a call")

// ResolveUnknown settles, from outside, whether the foreign call of an
// unfinished key took effect — a downstream's webhook telling that a payout
// was made, say, or an operator who checked by hand — and carries the
// request on from there, as Resume does. resolve gets the key's state: it
// returns happened true after recording the call's result in the state (as
// the phase's call function would have), or false for a call that did not
// take effect, which is then made; an error leaves the outcome unknown.
//
// It takes the key through the normal acquisition path, fenced like any
// attempt: while a client retry or the sweep holds the key it returns
// ErrInProgress, and of a webhook and a sweep reconciling at once exactly
// one resolution is applied. It returns ErrNotUnknown, and changes nothing,
// when the key is not waiting at a phase of wf with a reconcile function;
// a finished key returns its stored response. A key parked for good
// (KeyInfo.ParkedForGood: a bug parked it) is not resumed: ErrParked,
// changing nothing; record the outcome with RecordResolution, which keeps
// it until an operator unparks the key once the bug is fixed.
func ResolveUnknown[S any](ctx context.Context, r *Runner, wf *Workflow[S], scope, key string, resolve func(state *S) (happened bool, err error)) (*Response, error) {
	if wf == nil || resolve == nil {
		return nil, errors.New("atomicphase: ResolveUnknown needs a workflow and a resolve function")
	}
	if err := r.register(wf); err != nil {
		return nil, err
	}
	switch info, err := r.Inspect(ctx, scope, key); {
	case err != nil && !errors.Is(err, ErrKeyNotFound):
		return nil, err
	case err == nil && info.ParkedForGood:
		// Parked by a bug, which a resolution does not fix (a key
		// unparked meanwhile is an operator's to resume).
		return nil, ErrParked
	}
	return r.resume(ctx, scope, key, resumeOpts{workflow: wf.Name(), resolve: func(raw []byte) (bool, []byte, error) {
		var s S
		if err := json.Unmarshal(raw, &s); err != nil {
			return false, nil, Permanent(fmt.Errorf("decode state: %w", err))
		}
		happened, err := resolve(&s)
		if err != nil || !happened {
			return false, nil, err
		}
		b, err := encodeState(&s)
		return true, b, err
	}})
}
