package atomicphase

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/atomicphase/atomicphase/internal/keystore"
)

// Resume continues an unfinished key with no request at hand, from its
// recovery point, provided nobody holds it (or its lock is stale). Its
// workflow must be registered with this Runner. A finished key returns its
// stored response; a key never recorded returns ErrKeyNotFound; a key whose
// workflow is not registered returns ErrUnknownWorkflow and is left unlocked.
func (r *Runner) Resume(ctx context.Context, scope, key string) (*Response, error) {
	return r.resume(ctx, scope, key, resumeOpts{})
}

// resumeOpts say who resumes a key, when it is not a caller of Resume.
type resumeOpts struct {
	// sweep: the Sweeper, which takes only keys still due and parks keys
	// past Config.MaxAttempts.
	sweep bool
	// workflow and resolve: ResolveUnknown. The key's workflow must be
	// named workflow, and resolve stands in for the reconcile function of
	// the phase the attempt resumes into, which must have one.
	workflow string
	resolve  func([]byte) (bool, []byte, error)
	// known: the key's workflow as the caller found it listed (the
	// sweep), for the fault point before the take; "" when unknown.
	known string
}

func (r *Runner) resume(ctx context.Context, scope, key string, opts resumeOpts) (resp *Response, err error) {
	if !opts.sweep { // the sweep resumes keys another configuration recorded
		if err := validateKey(scope, key, r.cfg.MaxKeyLength); err != nil {
			return nil, err
		}
	}
	ctx, end := r.span(ctx, Span{Kind: SpanRequest, Scope: scope, Key: key})
	defer func() {
		if p := recover(); p != nil {
			end(fmt.Errorf("panic: %v", p))
			panic(p)
		}
		end(err)
	}()
	sent := time.Now() // the lease starts no earlier
	wfName := opts.workflow
	if wfName == "" {
		wfName = opts.known
	}
	row, err := r.take(ctx, wfName, scope, key, newLockToken(), opts.sweep)
	if inj := injected(err); inj != nil {
		return nil, inj
	}
	if err != nil {
		err = storeError("resume key", err)
		r.observe(ctx, Event{Kind: EventStoreError, Scope: scope, Key: key, Err: err})
		return nil, err
	}
	if row == nil {
		info, err := r.Inspect(ctx, scope, key)
		if err != nil {
			return nil, err
		}
		if info.Response != nil {
			var allowed map[string]bool
			if wf, ok := r.workflow(info.Workflow); ok {
				allowed = wf.replayable()
			}
			info.Response.Header = replayHeader(info.Response.Header, allowed)
			r.observe(ctx, Event{Kind: EventReplay, Workflow: info.Workflow, Scope: scope, Key: key})
			return info.Response, nil
		}
		r.observe(ctx, Event{Kind: EventInProgress, Workflow: info.Workflow, Scope: scope, Key: key})
		return nil, inProgress(info.LockExpiresIn, false)
	}
	if _, ok := r.workflow(row.Workflow); !ok {
		return nil, errors.Join(fmt.Errorf("%w: %q", ErrUnknownWorkflow, row.Workflow),
			r.unlock(ctx, scope, key, row.LockToken))
	}
	wf, ok := r.definitionFor(row, nil)
	if !ok {
		return nil, r.notRunnableHere(ctx, row, scope, key)
	}
	kind := EventFailedRetry
	if row.TookOver {
		kind = EventTakeover
	}
	a := newAttempt(r, wf, scope, key, row, sent)
	if opts.sweep {
		a.budget = r.cfg.LockTimeout
	}
	if opts.sweep {
		if row.Attempts > r.cfg.MaxAttempts {
			// Attempts that never finished (their processes died, or they
			// were taken over) count too: without this a key that kills
			// its process would be run forever.
			why := fmt.Errorf("%d attempts never finished; the limit is %d", row.Attempts-1, r.cfg.MaxAttempts)
			if _, err := r.release(ctx, scope, key, row.LockToken, why, 0, parkExhausted, false, resumeMayHaveCalled(wf, row)); err != nil {
				return nil, err
			}
			r.observe(ctx, Event{Kind: EventParked, Workflow: row.Workflow, Scope: scope, Key: key, Err: why})
			return nil, &PhaseError{Workflow: row.Workflow, Err: why, Parked: true}
		}
	}
	if opts.resolve != nil {
		if err := a.acceptResolution(row, opts.workflow); err != nil {
			return nil, errors.Join(err, r.unlock(ctx, scope, key, row.LockToken))
		}
		a.resolve = opts.resolve
	}
	r.observe(ctx, Event{Kind: kind, Workflow: row.Workflow, Scope: scope, Key: key})
	return a.run(ctx, row)
}

// resumeMayHaveCalled is mayHaveCalled for a key about to resume under wf,
// counted as called when its resume point cannot be found.
func resumeMayHaveCalled(wf AnyWorkflow, row *keystore.Row) bool {
	var jump string
	if row.JumpTarget != nil {
		jump = *row.JumpTarget
	}
	idx, err := wf.resumeAt(row.RecoveryPoint, jump)
	if err != nil {
		return true
	}
	return mayHaveCalled(wf.phaseSteps(), idx, row)
}
