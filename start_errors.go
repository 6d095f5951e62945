package atomicphase

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"

	"github.com/jackc/pgx/v5/pgconn"
)

// What a client hears when a request's input does not decode, or the
// workflow's start function refuses it. Only the library's own words, and
// the words of an InvalidInputError the workflow chose to send, reach the
// client: an error's text may name Go types, a database user or an
// address. Anything else a start function returns is a generic refusal,
// its cause in the log; a failure a retry may get past (a connection lost,
// a timeout) is retryable.

// refusedStart is a start function's refusal whose text is not the
// client's to read: its Error is generic, its cause is Unwrap's.
type refusedStart struct{ cause error }

func (e *refusedStart) Error() string {
	return ErrInvalidRequest.Error() + ": the workflow refused the request"
}
func (e *refusedStart) Unwrap() []error { return []error{ErrInvalidRequest, e.cause} }

// initialState builds a request's initial state (the input decoded, the
// start function run), and turns a failure into Run's answer: the client's
// mistake (ErrInvalidRequest, with a reason in the library's words or the
// workflow's InvalidInputError), a failure a retry may get past
// (retryable), or a generic refusal whose cause is logged.
func (r *Runner) initialState(ctx context.Context, wf AnyWorkflow, req *Request) ([]byte, error) {
	state, err := wf.initialState(req)
	if err == nil {
		return state, nil
	}
	var invalid *InvalidInputError
	switch {
	case errors.As(err, &invalid):
		return nil, fmt.Errorf("%w: %s", ErrInvalidRequest, invalid.Reason)
	case startTransient(err):
		r.logKey(ctx, slog.LevelWarn, "atomicphase: the workflow's start function failed; the request may be retried", wf.Name(), req.Scope, req.Key, "error", err)
		return nil, fmt.Errorf("atomicphase: the workflow's start function failed, and a retry may succeed: %w", err)
	}
	r.logKey(ctx, slog.LevelInfo, "atomicphase: the workflow's start function refused the request", wf.Name(), req.Scope, req.Key, "error", err)
	return nil, &refusedStart{cause: err}
}

// startTransient reports a start function's failure that a retry may get
// past: a context that ended, a connection lost or refused, a timeout, or a
// database error on the transient allow-list (classify.go).
func startTransient(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || pgconn.Timeout(err) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		_, ok := transientCode(pgErr.Code)
		return ok || connectionLost(pgErr)
	}
	// A failure to reach something (a refused or reset connection, a
	// timeout) may pass; a malformed address (*url.Error wraps it, and
	// reports itself a net.Error) never will.
	var connectErr *pgconn.ConnectError
	var opErr *net.OpError
	var netErr net.Error
	return errors.As(err, &connectErr) || errors.As(err, &opErr) || (errors.As(err, &netErr) && netErr.Timeout())
}
