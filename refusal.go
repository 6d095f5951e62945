package atomicphase

import (
	"context"
	"time"

	"github.com/atomicphase/atomicphase/internal/keystore"
)

// storeFailed reports a failed statement on the key store, before any
// phase ran.
func (r *Runner) storeFailed(ctx context.Context, wf AnyWorkflow, req *Request, what string, err error) error {
	err = storeError(what, err)
	r.observe(ctx, Event{Kind: EventStoreError, Workflow: wf.Name(), Scope: req.Scope, Key: req.Key, Err: err})
	return err
}

// refused explains, and reports, an acquisition that did not take the
// key: a key first used with another request, a finished key (replayed), a
// parked key (its failure, ErrParked), a new key over its scope's limit, or
// a key another attempt holds.
func (r *Runner) refused(ctx context.Context, row *keystore.Row, mismatch bool, wf AnyWorkflow, req *Request) (*Response, error) {
	e := Event{Workflow: wf.Name(), Scope: req.Scope, Key: req.Key}
	var resp *Response
	var err error
	switch {
	case mismatch:
		e.Kind, err = EventKeyMisuse, ErrFingerprintMismatch
	case row.ResponseStatus != nil:
		e.Kind = EventReplay
		resp = &Response{Status: *row.ResponseStatus, Body: row.ResponseBody, Replayed: true}
		if resp.Header, err = decodeHeader(row.ResponseHeader); err == nil {
			resp.Header = replayHeader(resp.Header, wf.replayable())
		} else {
			e.Kind, resp = EventStoreError, nil
			err = storeError("decode the stored response's header", err)
		}
	case row.Parked:
		e.Kind, err = EventParkedRefused, ErrParked
	case row.OverLimit:
		e.Kind, err = EventOverLimit, &TooManyKeysError{Limit: r.cfg.MaxUnfinishedPerScope, RetryAfter: time.Second}
	default:
		e.Kind, err = EventInProgress, inProgress(row.LockExpiresIn, row.Unheld)
	}
	r.observe(ctx, e)
	return resp, err
}

// inProgress is the error for a key held by another attempt whose lock goes
// stale in expiresInSeconds (nil when unknown). A live holder may finish
// any moment, so a retry is worth making within a second; a key held by
// no live lease, only by a foreign call's quiet period (unheld), changes
// nothing before that ends, which is when the retry should come.
func inProgress(expiresInSeconds *float64, unheld bool) error {
	e := &InProgressError{RetryAfter: time.Second}
	if expiresInSeconds != nil {
		e.LockExpiresIn = max(0, time.Duration(*expiresInSeconds*float64(time.Second)))
		e.RetryAfter = min(e.RetryAfter, e.LockExpiresIn)
		if unheld {
			e.RetryAfter = e.LockExpiresIn
		}
	}
	return e
}
