package atomicphase

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/atomicphase/atomicphase/internal/keystore"
)

// Letting go of the key: the last step of a request that took a key and did
// not finish it. A failed attempt (fail) records its error and when the
// sweep may try the key again, or parks the key, or marks its call's
// outcome unknown; an attempt that panics parks it (parkOnPanic); a key
// whose version no definition here runs is released with why, to rest or
// parked (notRunnableHere); a taking or a recording whose answer was lost
// only unlocks it, by the token it was sent with (unlock). Each is one
// statement, fenced by the lock token (keystore.Release), made even when
// the request's context has ended: a cancelled request must not leave its
// key locked for the lock timeout.

// cleanupTimeout bounds the unlock and rollback that follow a failed phase,
// which run even when the caller's context has ended.
const cleanupTimeout = 5 * time.Second

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
		how := parkNot
		switch {
		case errors.Is(err, ErrPermanent):
			how = parkFinal
		case a.attempts >= a.r.cfg.MaxAttempts:
			how = parkExhausted
			why = fmt.Errorf("attempt %d of %d failed: %w", a.attempts, a.r.cfg.MaxAttempts, why)
		}
		park := how != parkNot
		unknown := errors.Is(err, ErrOutcomeUnknown)
		released, rerr := a.r.release(ctx, a.scope, a.key, a.token, why, a.r.cfg.attemptBackoff(a.attempts), how, unknown, a.paid)
		switch {
		case rerr != nil:
			err = errors.Join(err, fmt.Errorf("unlock: %w", rerr))
		case !released:
			// Another attempt took the key (it is its to answer for now),
			// or finished it: nothing was parked or marked.
			a.log(ctx, slog.LevelWarn, "atomicphase: lock lost to a newer attempt", "phase", phase, "error", err)
			a.r.observe(ctx, Event{Kind: EventLockLost, Workflow: a.wf.Name(), Scope: a.scope, Key: a.key, Phase: phase})
			if ctxErr := ctx.Err(); ctxErr != nil && errors.Is(err, ctxErr) {
				// The caller's own cancellation stays visible to it. Only
				// that is wrapped: another failure (a permanent one, say)
				// must not make Run's error final, since the key is now
				// another attempt's to answer for.
				err = fmt.Errorf("%w (the attempt had failed: %w)", ErrLockLost, err)
			} else {
				err = fmt.Errorf("%w (the attempt had failed: %v)", ErrLockLost, err)
			}
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

// unlock releases the lock an attempt holds with token, so the next attempt
// can resume at once. It runs even when ctx has ended (a cancelled request
// must not leave its key locked for the lock timeout), bounded by
// cleanupTimeout. An unlock with a token that moved on changes nothing.
func (r *Runner) unlock(ctx context.Context, scope, key string, token int64) error {
	_, err := r.release(ctx, scope, key, token, nil, 0, parkNot, false, false)
	return err
}

// parkHow says whether, and how, a release parks its key.
type parkHow int

const (
	parkNot parkHow = iota
	// parkExhausted: its attempts ran out; the sweep stops, a client's
	// retry still resumes it.
	parkExhausted
	// parkFinal: a permanent failure; a client's retry is answered with
	// ErrParked until an operator acts.
	parkFinal
)

// release unlocks the key an attempt holds with token. When why is set it
// records the error and, unless it parks, when the sweep may try the key
// again (retryIn from now); park says whether it parks the key for an
// operator, and how; unknown marks the outcome of its foreign call
// unknown; called records that a foreign call of the key may have gone
// out (Runner.Forget then refuses the key while it is unfinished). Like unlock it runs even when ctx has ended.
//
// It reports whether it released anything: false when the token had moved
// on (another attempt took the key) or the key finished meanwhile.
func (r *Runner) release(ctx context.Context, scope, key string, token int64, why error, retryIn time.Duration, park parkHow, unknown, called bool) (bool, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	rel := keystore.Release{Scope: scope, Key: key, Token: token, Park: park != parkNot, Final: park == parkFinal, Unknown: unknown, Called: called}
	if why != nil {
		m := boundedError(r.redactError(why))
		rel.Error = &m
		if park == parkNot {
			us := retryIn.Microseconds()
			rel.RetryInUS = &us
		}
	}
	return r.store.Release(ctx, r.poolFor(scope), &rel)
}

// boundedError is err's text as a key row keeps it: valid UTF-8 without NUL,
// at most keystore.MaxLastError bytes.
func boundedError(err error) string {
	msg := strings.ToValidUTF8(strings.ReplaceAll(err.Error(), "\x00", ""), "?")
	if len(msg) > keystore.MaxLastError {
		msg = strings.ToValidUTF8(msg[:keystore.MaxLastError], "") + "…"
	}
	return msg
}
