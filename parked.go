package atomicphase

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
)

// Parked keys are bounded. A key parks when its request failed in a way a
// retry cannot fix; its client's retries are answered with ErrParked, and
// it holds a place in its scope's Config.MaxUnfinishedPerScope until an
// operator acts: unparks it (the bug fixed), forgets it, or leaves it to
// the sweep, which deletes it after SweepConfig.ParkedRetention. Operators
// act on one key (Unpark, Forget) or on every key a filter selects
// (UnparkKeys, ForgetKeys), with a dry run that only lists them.

// BulkOpts are the options of ForgetKeys and UnparkKeys. A nil *BulkOpts
// means all defaults.
type BulkOpts struct {
	// DryRun lists the keys the call would act on, and changes nothing.
	// Defaults to false.
	DryRun bool
	// Force makes ForgetKeys forget the keys that Forget refuses with
	// ErrOutcomeUnsettled or ErrKeyPaid too, each through ForgetForced,
	// with Actor and Reason (both required with Force) recorded in its
	// audit trail. Without it such keys are skipped, and a dry run lists
	// them with KeyInfo.Unsettled or KeyInfo.Paid set. Defaults to false.
	Force bool
	// Actor and Reason are who forces a forget and why (Force).
	Actor, Reason string
}

// ForgetKeys forgets (as Forget does) every key f selects, at most
// f.Limit of them (DefaultListLimit when unset), oldest first, and returns
// the keys it forgot, or with opts.DryRun the keys it would forget. Only
// parked and finished keys can be forgotten: f.Status must be KeyParked
// (the default) or KeyFinished. A key that changed since it was listed (a
// retry took it, say) is skipped, as Forget would refuse it. So is a key
// whose call's outcome is unknown or whose call may be in flight
// (ErrOutcomeUnsettled, KeyInfo.Unsettled), and a finished key that may
// have paid (ErrKeyPaid, KeyInfo.Paid), unless opts.Force gives who forces
// it and why.
func (r *Runner) ForgetKeys(ctx context.Context, f *KeyFilter, opts *BulkOpts) ([]*KeyInfo, error) {
	force := opts != nil && opts.Force
	if force && (strings.TrimSpace(opts.Actor) == "" || strings.TrimSpace(opts.Reason) == "") {
		return nil, errors.New("atomicphase: ForgetKeys: BulkOpts.Force needs who forces it (Actor) and why (Reason), for the audit trail")
	}
	return r.bulk(ctx, "ForgetKeys", f, opts, []KeyStatus{KeyParked, KeyFinished}, func(k *KeyInfo) error {
		err := r.Forget(ctx, k.Scope, k.Key)
		if force && (errors.Is(err, ErrOutcomeUnsettled) || errors.Is(err, ErrKeyPaid)) {
			err = r.ForgetForced(ctx, k.Scope, k.Key, opts.Actor, opts.Reason)
		}
		if errors.Is(err, ErrKeyUnfinished) || errors.Is(err, ErrKeyNotFound) || errors.Is(err, ErrOutcomeUnsettled) || errors.Is(err, ErrKeyPaid) {
			return errSkipped
		}
		return err
	})
}

// UnparkKeys unparks (as Unpark does) every parked key f selects, at most
// f.Limit of them (DefaultListLimit when unset), oldest first, and returns
// the keys it unparked, or with opts.DryRun the keys it would unpark.
// f.Status must be KeyParked or unset.
func (r *Runner) UnparkKeys(ctx context.Context, f *KeyFilter, opts *BulkOpts) ([]*KeyInfo, error) {
	return r.bulk(ctx, "UnparkKeys", f, opts, []KeyStatus{KeyParked}, func(k *KeyInfo) error {
		err := r.Unpark(ctx, k.Scope, k.Key)
		if errors.Is(err, ErrKeyFinished) || errors.Is(err, ErrKeyNotFound) || errors.Is(err, ErrKeyNotParked) {
			return errSkipped
		}
		return err
	})
}

// errSkipped is a bulk action's answer for a key that changed since it was
// listed.
var errSkipped = errors.New("skipped")

// bulk lists the keys f selects (its status one of allowed, the first when
// unset) and applies act to each, unless opts asks for a dry run.
func (r *Runner) bulk(ctx context.Context, what string, f *KeyFilter, opts *BulkOpts, allowed []KeyStatus, act func(*KeyInfo) error) ([]*KeyInfo, error) {
	var filter KeyFilter
	if f != nil {
		filter = *f
	}
	if filter.Status == "" {
		filter.Status = allowed[0]
	}
	ok := false
	for _, s := range allowed {
		ok = ok || filter.Status == s
	}
	if !ok {
		return nil, fmt.Errorf("atomicphase: %s: KeyFilter.Status %q: only keys %v can be acted on", what, filter.Status, allowed)
	}
	keys, err := r.ListKeys(ctx, &filter)
	if err != nil || (opts != nil && opts.DryRun) {
		return keys, err
	}
	done := keys[:0]
	for _, k := range keys {
		switch err := act(k); {
		case errors.Is(err, errSkipped):
		case err != nil:
			return done, err
		default:
			done = append(done, k)
		}
	}
	return done, nil
}

// ReapParked deletes, in one statement, at most batch keys parked longer
// than olderThan ago (never one whose call's outcome is unknown or whose
// call may be in flight: KeyInfo.Unsettled), logs each (with its last error) and reports it
// (EventParkedReaped), and returns how many it deleted. The Sweeper calls
// it on every sweep with SweepConfig.ParkedRetention; it is also for a cron
// job or the CLI.
func (r *Runner) ReapParked(ctx context.Context, olderThan time.Duration, batch int) (int, error) {
	if olderThan < 0 || batch <= 0 {
		return 0, fmt.Errorf("atomicphase: ReapParked(%s, %d): want a non-negative age and a positive batch size", olderThan, batch)
	}
	keys, err := r.store.ReapParked(ctx, r.pool, olderThan, batch)
	if err != nil {
		return 0, storeError("reap parked keys", err)
	}
	for _, k := range keys {
		why := errors.New(k.LastError)
		r.logKey(ctx, slog.LevelWarn, "atomicphase: parked key deleted after its retention", k.Workflow, k.Scope, k.Key,
			"parked_retention", olderThan, "last_error", k.LastError)
		r.observe(ctx, Event{Kind: EventParkedReaped, Workflow: k.Workflow, Scope: k.Scope, Key: k.Key, Err: why})
	}
	return len(keys), nil
}
