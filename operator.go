package atomicphase

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/atomicphase/atomicphase/internal/keystore"
)

// The operator's statements on keys: list them, make one eligible for the
// sweep again, forget one. None of them is on a request's path. Listing
// filters the whole table; every other statement is keyed by (scope, key).

// KeyFilter selects keys for ListKeys. A nil *KeyFilter lists the first
// DefaultListLimit keys of any status.
type KeyFilter struct {
	// Status keeps keys with this status. Defaults to any.
	Status KeyStatus
	// Workflow keeps keys of this workflow. Defaults to any.
	Workflow string
	// Scope keeps keys of this scope. Defaults to any.
	Scope string
	// OlderThan keeps keys created longer ago than this. Defaults to any
	// age.
	OlderThan time.Duration
	// Limit is the most keys returned, oldest first. Defaults to
	// DefaultListLimit.
	Limit int
	// ErrorContains keeps keys whose last error contains this text (case
	// sensitive). Defaults to any.
	ErrorContains string
}

// DefaultListLimit is KeyFilter.Limit's default.
const DefaultListLimit = 100

// ListKeys lists keys, oldest first, for operators: the CLI's keys command,
// a dashboard. It reads every shard of a distributed key table; keep it off
// request paths.
func (r *Runner) ListKeys(ctx context.Context, f *KeyFilter) ([]*KeyInfo, error) {
	if f == nil {
		f = &KeyFilter{}
	}
	if f.Status != "" && !slices.Contains(KeyStatuses(), f.Status) {
		return nil, fmt.Errorf("atomicphase: KeyFilter.Status %q is not a key status; use in_progress, stale, abandoned, unknown, parked or finished", f.Status)
	}
	limit := f.Limit
	if limit <= 0 {
		limit = DefaultListLimit
	}
	rows, err := r.store.List(ctx, r.pool, &keystore.Filter{Status: string(f.Status), Workflow: f.Workflow, Scope: f.Scope,
		OlderThan: f.OlderThan, Limit: limit, ErrorContains: f.ErrorContains})
	if err != nil {
		return nil, storeError("list keys", err)
	}
	out := make([]*KeyInfo, len(rows))
	for i, row := range rows {
		out[i] = r.keyInfo(row)
	}
	return out, nil
}

// ErrKeyFinished is returned by Unpark for a key that is already finished.
var ErrKeyFinished = errors.New("atomicphase: idempotency key already finished")

// ErrKeyNotParked is returned by Unpark for an unfinished key that is not
// parked: there is nothing to unpark, and its attempts are left as they
// are (MakeDue clears its backoff).
var ErrKeyNotParked = errors.New("atomicphase: idempotency key not parked")

// ErrKeyParked is returned by MakeDue for a parked key: Unpark is what
// makes it due again.
var ErrKeyParked = errors.New("atomicphase: idempotency key parked; unpark it")

// ErrKeyUnfinished is returned by Forget for a key that is neither finished
// nor parked: forgetting it would strand whatever its phases did.
var ErrKeyUnfinished = errors.New("atomicphase: idempotency key unfinished and not parked")

// ErrOutcomeUnsettled is returned by Forget for a parked key that may have
// paid without knowing it: the outcome of its foreign call is unknown
// (KeyInfo.UnknownAt), or a call it was making may still be acted on by
// the downstream (KeyInfo.CallUntil). Forgetting it would let the client's
// retry run as a new request, with new downstream keys, and pay again.
// Record a verdict (RecordResolution) once the downstream says what
// happened, or give the key up with ForgetForced and a reason.
var ErrOutcomeUnsettled = errors.New("atomicphase: idempotency key's foreign call outcome is unknown or the call may be in flight; forgetting it could pay twice")

// ErrKeyPaid is returned by Forget for a finished key that may have made a
// foreign call (KeyInfo.Paid): forgetting it would let the client's retry
// run as a new request, with new downstream keys, and pay again. Give it
// up with ForgetForced and a reason, or leave it to the reaper.
var ErrKeyPaid = errors.New("atomicphase: idempotency key finished after a foreign call that may have paid; forgetting it lets a retry pay again")

// Unpark makes a parked key eligible for the next sweep at once: it clears
// the parked mark and any backoff, and gives the key a fresh budget of
// Config.MaxAttempts attempts (its last error stays for reference). The
// sweep of a process that registered the key's workflow then resumes it
// through the normal acquisition path; a client retry would anyway. It
// returns ErrKeyNotFound for a key never recorded, ErrKeyFinished for a
// finished one, and ErrKeyNotParked, changing nothing, for any other key.
func (r *Runner) Unpark(ctx context.Context, scope, key string) error {
	return r.schedule(ctx, scope, key, true)
}

// MakeDue makes an unfinished key that is not parked eligible for the
// next sweep at once: it clears the key's backoff, leaving its attempts as
// they are (a key waiting for its next attempt, or for its unknown
// outcome's reconciliation, is then resumed by the next sweep, as Unpark
// has a parked key resumed). It returns ErrKeyNotFound for a key never
// recorded, ErrKeyFinished for a finished one and ErrKeyParked, changing
// nothing, for a parked one.
func (r *Runner) MakeDue(ctx context.Context, scope, key string) error {
	return r.schedule(ctx, scope, key, false)
}

func (r *Runner) schedule(ctx context.Context, scope, key string, unpark bool) error {
	what, schedule, wrong := "make key due", r.store.MakeDue, ErrKeyParked
	if unpark {
		what, schedule, wrong = "unpark key", r.store.Unpark, ErrKeyNotParked
	}
	ok, err := schedule(ctx, r.poolFor(scope), scope, key)
	if err != nil {
		return storeError(what, err)
	}
	if ok {
		return nil
	}
	info, err := r.Inspect(ctx, scope, key)
	switch {
	case err != nil:
		return err
	case info.Response != nil:
		return ErrKeyFinished
	}
	return wrong
}

// Forget deletes a finished or parked key, so that a stored answer produced
// by a since-fixed bug is not replayed forever, or a parked request is given
// up. The same client key is then a new request, with new downstream keys:
// nothing its earlier phases did is re-linked, and nothing is undone. It
// returns ErrKeyNotFound for a key never recorded, ErrKeyUnfinished for
// one still in progress or waiting to be resumed, ErrOutcomeUnsettled for
// a parked key whose call's outcome is unknown or whose call may be in
// flight, and ErrKeyPaid for a finished key that may have made a foreign
// call (KeyInfo.Paid); ForgetForced is the way to give up either.
func (r *Runner) Forget(ctx context.Context, scope, key string) error {
	info, err := r.Inspect(ctx, scope, key)
	switch {
	case err != nil:
		return err
	case info.Paid:
		// A key read finished stays so: no write takes a finished key.
		return ErrKeyPaid
	}
	// A key read unfinished that finishes before the delete is left, to be
	// judged as it then is: it may have paid.
	return r.forget(ctx, scope, key, false, info.Response != nil)
}

// ForgetForced is Forget for a key that Forget refuses with
// ErrOutcomeUnsettled or ErrKeyPaid: an operator who has settled the
// call's outcome with the downstream some other way, or who means the
// client's retry to run again, gives the key up. actor (who) and reason
// (why) are required; the entry, with the key's recovery point, downstream
// salt and unknown-outcome mark, goes to the audit trail before the key is
// deleted, so that the payment it may have made can still be found. Keys
// in progress or waiting to be resumed are still refused
// (ErrKeyUnfinished).
func (r *Runner) ForgetForced(ctx context.Context, scope, key, actor, reason string) error {
	if strings.TrimSpace(actor) == "" || strings.TrimSpace(reason) == "" {
		return errors.New("atomicphase: ForgetForced needs who forces it (actor) and why (reason), for the audit trail")
	}
	info, err := r.Inspect(ctx, scope, key)
	if err != nil {
		return err
	}
	detail, _ := json.Marshal(map[string]any{ // plain values: cannot fail
		"forced": true, "status_before": info.Status, "recovery_point": info.RecoveryPoint, "paid": info.Paid,
		"unknown_at": info.UnknownAt, "call_until": info.CallUntil, "called_at": info.CalledAt,
		"downstream_salt": info.DownstreamSalt, "downstream_keys": info.DownstreamKeys,
	})
	// The trail first: a forced forget that the trail does not show must
	// not happen. (A refusal below leaves an entry of an attempt that
	// deleted nothing; its error says so to the operator.)
	if err := r.RecordAudit(ctx, &AuditEntry{Scope: scope, Key: key, Actor: actor, Action: "forget", Note: reason, Detail: detail}); err != nil {
		return err
	}
	return r.forget(ctx, scope, key, true, true)
}

// forget deletes the key, unsettled too when force is set, and finished
// only when finished is set.
func (r *Runner) forget(ctx context.Context, scope, key string, force, finished bool) error {
	gone, err := r.store.Forget(ctx, r.poolFor(scope), scope, key, force, finished)
	switch {
	case err != nil:
		return storeError("forget key", err)
	case gone:
		return nil
	}
	info, ierr := r.Inspect(ctx, scope, key)
	switch {
	case ierr != nil:
		return ierr
	case (info.Status == KeyFinished || info.Status == KeyParked) && info.Unsettled:
		return ErrOutcomeUnsettled
	case info.Paid && !force:
		return ErrKeyPaid
	case info.Response != nil && !force:
		// Finished since it was read: asked again, it may go.
		return r.Forget(ctx, scope, key)
	}
	return ErrKeyUnfinished
}

// RecordResolution settles by hand whether the foreign call an unfinished
// key is waiting on took effect, when neither its reconcile function nor a
// webhook can tell: an operator who checked with the downstream records the
// verdict, with a note saying who and how, and the key is made due at once.
// The next attempt that resumes into the phase after the key's current
// recovery point takes the verdict (once) instead of asking the reconcile
// function: not happened makes the call; happened goes on as if the call
// had succeeded, with the state as it is (the reconcile function is still
// asked first for the result, and only its "cannot tell" is overruled).
// The verdict, the note and when stay in the row (KeyInfo.Resolution).
//
// Like Unpark it gives the key a fresh budget of Config.MaxAttempts
// attempts: a key parked because its reconciliation failed that many times
// would otherwise be parked again before the verdict is read. A key parked
// for good (a permanent failure, a panic: a bug in its code) is not made
// due: the verdict is recorded, and the key stays parked, its attempts as
// they were, until an operator unparks it; the attempt that resumes it
// then takes the verdict.
//
// It returns ErrKeyNotFound for a key never recorded, ErrKeyFinished for a
// finished key, ErrInProgress while an attempt holds the key, and
// ErrNoUnknownOutcome, recording nothing, for a key that waits on no
// unknown outcome (its phase has no reconcile function, or its call is
// known not to have been made): there is no verdict to give, and Unpark is
// what retries it.
func (r *Runner) RecordResolution(ctx context.Context, scope, key string, happened bool, note string) error {
	return r.recordResolution(ctx, scope, key, happened, note, nil)
}

// MaxResolutionResult is the most bytes of JSON RecordResolutionWithResult
// takes: a call's result (an id, a status, an amount), not a document.
const MaxResolutionResult = 64 << 10

// RecordResolutionWithResult records a "happened" verdict, as
// RecordResolution does, together with the call's result as the operator
// read it from the downstream (its support, its dashboard): result is JSON,
// which the phase's reconcile function, asked first as ever, finds in
// ForeignCall.OperatorResult and records in the state as the call function
// would have. Without it, a verdict of happened goes on with the state as
// it is: a label id, a transfer id the next phases need stay empty. A
// reconcile function that does not read the result ignores it.
//
// It returns an error, changing nothing, when result is not one JSON value
// of at most MaxResolutionResult bytes, and otherwise the errors of
// RecordResolution.
func (r *Runner) RecordResolutionWithResult(ctx context.Context, scope, key, note string, result []byte) error {
	switch {
	case len(result) == 0:
		return errors.New("atomicphase: RecordResolutionWithResult needs the call's result as JSON; use RecordResolution for a verdict without one")
	case len(result) > MaxResolutionResult:
		return fmt.Errorf("atomicphase: the call's result is %d bytes; at most %d are kept (MaxResolutionResult)", len(result), MaxResolutionResult)
	case !json.Valid(result):
		return errors.New("atomicphase: the call's result is not valid JSON; quote a string (\"lbl-1\") or give an object ({\"label_id\": \"lbl-1\"})")
	}
	return r.recordResolution(ctx, scope, key, true, note, result)
}

func (r *Runner) recordResolution(ctx context.Context, scope, key string, happened bool, note string, result []byte) error {
	res, err := r.store.RecordResolution(ctx, r.poolFor(scope), scope, key, happened, note, result)
	switch {
	case err != nil:
		return storeError("record resolution", err)
	case res == keystore.Resolved:
		return nil
	case res == keystore.NoUnknownOutcome:
		return ErrNoUnknownOutcome
	}
	info, ierr := r.Inspect(ctx, scope, key)
	switch {
	case ierr != nil:
		return ierr
	case info.Response != nil:
		return ErrKeyFinished
	default:
		return inProgress(info.LockExpiresIn, false)
	}
}

// ErrNoUnknownOutcome is returned by RecordResolution for a key that waits
// on no foreign call of unknown outcome: the phase it stands before has no
// reconcile function (its calls carry a downstream key, and are simply
// made again), or its call is known not to have been made. No verdict is
// recorded; Unpark retries the key, Forget drops it.
var ErrNoUnknownOutcome = errors.New("atomicphase: the key waits on no unknown outcome; unpark it to retry it")
