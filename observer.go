package atomicphase

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"
)

// EventKind names a decision the Runner or the Sweeper made. The names are
// the metric names the OpenTelemetry adapter counts them under.
type EventKind string

// The decisions. Each is reported once per occurrence: a replay is one
// replay, a takeover one takeover.
const (
	// EventCreated: a new key was recorded and its first attempt began.
	EventCreated EventKind = "reserve.created"
	// EventReplay: a finished key's stored response was replayed.
	EventReplay EventKind = "reserve.replay"
	// EventInProgress: another attempt holds the key (409).
	EventInProgress EventKind = "reserve.in_progress"
	// EventKeyMisuse: the key was reused with another request (422).
	EventKeyMisuse EventKind = "reserve.key_misuse"
	// EventFailedRetry: an unfinished key that no attempt held (its last
	// attempt failed, or it was parked) was taken by a retry or a resume.
	EventFailedRetry EventKind = "reserve.failed_retry"
	// EventTakeover: a key whose holder's lock had gone stale (the holder
	// died, or was slower than the lock timeout) was taken over.
	EventTakeover EventKind = "reserve.takeover"
	// EventOverLimit: a new key was refused because its scope has
	// Config.MaxUnfinishedPerScope unfinished keys (429).
	EventOverLimit EventKind = "reserve.over_limit"
	// EventDataRefused: the database refused the request's own data (a
	// constraint it breaks, a value out of range) in Phase; the key was
	// finished with a 422 (Err says what was refused).
	EventDataRefused EventKind = "key.data_refused"
	// EventParkedRefused: a retry of a parked key was answered with its
	// failure (500) without running anything.
	EventParkedRefused EventKind = "reserve.parked"
	// EventParkedReaped: the sweep deleted a parked key after
	// SweepConfig.ParkedRetention (Err is its last error).
	EventParkedReaped EventKind = "key.parked_reaped"
	// EventStoreError: a statement on the key store failed (Err says how).
	EventStoreError EventKind = "store.error"
	// EventPhaseCommitted: a phase committed (Duration: the whole phase,
	// foreign call included).
	EventPhaseCommitted EventKind = "phase.committed"
	// EventPhaseFailed: a phase failed and rolled back (Err, Duration).
	EventPhaseFailed EventKind = "phase.failed"
	// EventLockLost: an attempt found at commit that another took its key.
	EventLockLost EventKind = "lock.lost"
	// EventParked: a key was parked for an operator (Err says why).
	EventParked EventKind = "key.parked"
	// EventZombieKey: the sweep completed an abandoned key: one whose
	// client stopped retrying.
	EventZombieKey EventKind = "zombie_key"
	// EventTTLPruned: the sweep deleted finished keys past their retention
	// (Count says how many).
	EventTTLPruned EventKind = "ttl_pruned"
	// EventUnknown: a call to a downstream without idempotency keys failed
	// after it may have been sent; its outcome is unknown (Err says how).
	EventUnknown EventKind = "reserve.unknown"
	// EventReconcileScheduled: a key whose call's outcome is unknown was
	// released for reconciliation later (by the sweep or a retry).
	EventReconcileScheduled EventKind = "reconcile.scheduled"
	// EventReconcileHappened: reconciliation found that the call took
	// effect; its result is recorded and the call is not made again.
	EventReconcileHappened EventKind = "reconcile.resolved_happened"
	// EventReconcileNotHappened: reconciliation found that the call did not
	// take effect; it is made (again).
	EventReconcileNotHappened EventKind = "reconcile.resolved_not_happened"
	// EventReconcileFailed: the reconcile function could not tell.
	EventReconcileFailed EventKind = "reconcile.failed"
	// EventUnknownWorkflow: the sweep left keys alone whose workflow
	// (Workflow) this process has not registered; Count says how many it
	// saw. Every sweep reports the keys still waiting, so it is a level,
	// not an increment.
	EventUnknownWorkflow EventKind = "sweep.unknown_workflow"
)

// EventKinds returns every EventKind, in the order the docs list them.
func EventKinds() []EventKind {
	return []EventKind{EventCreated, EventReplay, EventInProgress, EventKeyMisuse, EventFailedRetry, EventTakeover,
		EventOverLimit, EventUnknown, EventParkedRefused, EventStoreError, EventPhaseCommitted, EventPhaseFailed, EventLockLost,
		EventParked, EventDataRefused, EventParkedReaped,
		EventReconcileScheduled, EventReconcileHappened, EventReconcileNotHappened, EventReconcileFailed,
		EventZombieKey, EventTTLPruned, EventUnknownWorkflow}
}

// Event is one decision, with what it concerns. Scope and Key are given as
// Config.RedactKey left them.
type Event struct {
	Kind     EventKind
	Workflow string
	Scope    string
	Key      string
	// Phase is set for phase events.
	Phase string
	// Duration is set for phase events.
	Duration time.Duration
	// Err is set for failures.
	Err error
	// Count is set for events about many keys at once.
	Count int
}

// SpanKind says what a span covers.
type SpanKind string

// The spans.
const (
	// SpanRequest covers one Run or Resume: acquisition, phases, answer.
	SpanRequest SpanKind = "request"
	// SpanPhase covers one phase of a request, foreign call included.
	SpanPhase SpanKind = "phase"
)

// Span describes a span an Observer is asked to open.
type Span struct {
	Kind     SpanKind
	Workflow string
	Scope    string
	Key      string
	Phase    string // for SpanPhase
}

// Observer watches a Runner and its Sweeper: metrics, traces, audit. Both
// call it synchronously on the request's goroutine, so it must be quick and
// safe for concurrent use. The OpenTelemetry adapter in package apotel is
// one; ObserverFunc adapts a plain function.
type Observer interface {
	// Observe is told of one decision.
	Observe(ctx context.Context, e Event)
	// StartSpan opens a span and returns the context that carries it (the
	// rest of the request, or the phase, runs under it) and the function
	// that ends it with the request's or phase's error.
	StartSpan(ctx context.Context, s Span) (context.Context, func(err error))
}

// ObserverFunc adapts a function to an Observer that opens no spans.
type ObserverFunc func(ctx context.Context, e Event)

// Observe calls f.
func (f ObserverFunc) Observe(ctx context.Context, e Event) { f(ctx, e) }

// StartSpan opens nothing.
func (f ObserverFunc) StartSpan(ctx context.Context, _ Span) (context.Context, func(error)) {
	return ctx, func(error) {}
}

// The Config's hooks (the Observer's methods, RedactKey, RedactError) are
// called while a request holds what it must let go of (a pooled
// connection, its key's lease), often from the code that lets it go. A
// panic in one is recovered where the hook is called, logged with its
// stack (Config.Logger, else slog's default logger, as net/http logs a
// handler's panic), and the request goes on without what the hook was to
// give: the event is dropped, the span not opened or not ended, the text
// withheld. A hook thus never strands a connection or a key; its bug is
// reported, not hidden.

// hookPanicked reports a panic recovered from hook. A Logger that panics
// too is the last hook: its panic is dropped.
func (r *Runner) hookPanicked(ctx context.Context, hook string, p any) {
	defer func() { _ = recover() }()
	l := r.cfg.Logger
	if l == nil {
		l = slog.Default()
	}
	l.Log(ctx, slog.LevelError, "atomicphase: "+hook+" panicked; the request went on without it",
		"panic", fmt.Sprint(p), "stack", string(debug.Stack()))
}

// withheldText stands in for a text whose redaction panicked.
const withheldText = "(withheld: Config.RedactError panicked)"

// observe reports e, if anyone listens, with the scope and key redacted.
func (r *Runner) observe(ctx context.Context, e Event) {
	if r.cfg.Observer == nil {
		return
	}
	e.Scope, e.Key = r.redact(e.Scope, e.Key)
	e.Err = r.redactError(e.Err)
	defer func() {
		if p := recover(); p != nil {
			r.hookPanicked(ctx, "Config.Observer's Observe", p)
		}
	}()
	r.cfg.Observer.Observe(ctx, e)
}

// span opens a span, if anyone listens.
func (r *Runner) span(ctx context.Context, s Span) (sctx context.Context, end func(error)) {
	if r.cfg.Observer == nil {
		return ctx, noEnd
	}
	s.Scope, s.Key = r.redact(s.Scope, s.Key)
	defer func() {
		if p := recover(); p != nil {
			r.hookPanicked(ctx, "Config.Observer's StartSpan", p)
			sctx, end = ctx, noEnd
		}
	}()
	sctx, observerEnd := r.cfg.Observer.StartSpan(ctx, s)
	return sctx, func(err error) {
		err = r.redactError(err)
		defer func() {
			if p := recover(); p != nil {
				r.hookPanicked(ctx, "the end of a span of Config.Observer's", p)
			}
		}()
		observerEnd(err)
	}
}

func noEnd(error) {}

func (r *Runner) redact(scope, key string) (rs, rk string) {
	if r.cfg.RedactKey == nil {
		return scope, key
	}
	defer func() {
		if p := recover(); p != nil {
			r.hookPanicked(context.Background(), "Config.RedactKey", p)
			rs, rk = "(withheld)", "(withheld)"
		}
	}()
	return r.cfg.RedactKey(scope, key)
}

// redactText is msg as Config.RedactError rewrites it (which is set).
func (r *Runner) redactText(msg string) (out string) {
	defer func() {
		if p := recover(); p != nil {
			r.hookPanicked(context.Background(), "Config.RedactError", p)
			out = withheldText
		}
	}()
	return r.cfg.RedactError(msg)
}

// logKey logs msg about a key: every line names the workflow, scope and key
// (the latter two as Config.RedactKey leaves them).
func (r *Runner) logKey(ctx context.Context, level slog.Level, msg, workflow, scope, key string, args ...any) {
	if r.cfg.Logger == nil {
		return
	}
	scope, key = r.redact(scope, key)
	if r.cfg.RedactError != nil {
		for i, a := range args {
			if err, ok := a.(error); ok {
				args[i] = r.redactError(err)
			}
		}
	}
	defer func() {
		if p := recover(); p != nil {
			r.hookPanicked(ctx, "Config.Logger", p)
		}
	}()
	r.cfg.Logger.Log(ctx, level, msg, append([]any{"workflow", workflow, "scope", scope, "key", key}, args...)...)
}

// RedactError returns msg as Config.RedactError rewrites it, and msg
// itself without one: for code that shows an error the Runner returned
// (Run, Resume and the operator methods return the original text, for the
// caller to branch on), an operator's console among them.
func (r *Runner) RedactError(msg string) string {
	if r.cfg.RedactError == nil {
		return msg
	}
	return r.redactText(msg)
}

// redactError is err with its text as Config.RedactError rewrites it; nil
// and unredacted configurations leave err as it is.
func (r *Runner) redactError(err error) error {
	if err == nil || r.cfg.RedactError == nil {
		return err
	}
	return &redactedError{msg: r.redactText(err.Error()), err: err}
}

// redactedError shows redacted text and unwraps to the original error, so
// what callers branch on still holds.
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// log logs msg about this attempt's key.
func (a *attempt) log(ctx context.Context, level slog.Level, msg string, args ...any) {
	a.r.logKey(ctx, level, msg, a.wf.Name(), a.scope, a.key, args...)
}
