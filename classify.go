package atomicphase

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"
)

// How the engine classifies the errors it meets on the key store and in a
// phase's transaction: which mean the store is unavailable, which may have
// lost a commit's answer, which are conflicts worth retrying, and which the
// same request meets every time.

// storeError classifies a failed key-store statement:
//   - a cancelled or expired context is passed through as it is;
//   - a missing table or function wraps ErrSchemaMissing, with how to fix it;
//   - the store counts as unavailable (ErrStoreUnavailable) when the driver
//     never got an answer (no server error at all), or when the server
//     answered by dropping the connection (see connectionLost), as when the
//     backend was terminated while the connection sat in the pool;
//   - any other server error is passed through.
func storeError(what string, err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("atomicphase: %s: %w", what, err)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || connectionLost(pgErr) {
		return fmt.Errorf("%w: %s: %w", ErrStoreUnavailable, what, err)
	}
	switch pgErr.Code {
	case pgerrcode.UndefinedTable, pgerrcode.UndefinedFunction:
		return fmt.Errorf("%w: %s: %w (run atomicphase.Migrate, or check Config.Schema)", ErrSchemaMissing, what, err)
	}
	return fmt.Errorf("atomicphase: %s: %w", what, err)
}

// connectionLost reports a server error after which the connection is gone:
// a FATAL or PANIC, a connection exception (class 08), or an operator
// intervention that ends sessions (shutdown, crash, no connections now, the
// database dropped, an idle session timed out).
func connectionLost(e *pgconn.PgError) bool {
	if e.Severity == "FATAL" || e.Severity == "PANIC" || pgerrcode.IsConnectionException(e.Code) {
		return true
	}
	switch e.Code {
	case pgerrcode.AdminShutdown, pgerrcode.CrashShutdown, pgerrcode.CannotConnectNow,
		pgerrcode.DatabaseDropped, pgerrcode.IdleSessionTimeout:
		return true
	}
	return false
}

// isConflict reports serialization failures and deadlocks: the transient
// conflicts a phase's transaction is retried for.
func isConflict(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) &&
		(pgErr.Code == pgerrcode.SerializationFailure || pgErr.Code == pgerrcode.DeadlockDetected)
}

// isDataError reports a server error that the same statement with the same
// values meets every time: a data exception (class 22, such as a NUL in
// text or a number out of range), a syntax or access rule violation (class
// 42, such as a misspelt column or a missing privilege), or a constraint the
// row itself breaks (NOT NULL, CHECK, UNIQUE, EXCLUDE). A phase that meets
// one fails permanently: retrying it would only loop. A foreign key
// violation is not among them: the row it needs may be committed by the
// time of the retry.
func isDataError(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case pgerrcode.NotNullViolation, pgerrcode.CheckViolation, pgerrcode.UniqueViolation, pgerrcode.ExclusionViolation:
		return true
	}
	return pgerrcode.IsDataException(pgErr.Code) || pgerrcode.IsSyntaxErrororAccessRuleViolation(pgErr.Code)
}

// answerMayBeLost reports an error, met once a connection was in hand,
// after which a statement may have committed unseen: anything but an error
// the server answered with while the connection stayed up (which means the
// statement failed, and nothing committed). pgconn.SafeToRetry is no guide
// here: with the simple protocol it calls a connection lost after the
// statement ran "safe to retry".
func answerMayBeLost(err error) bool {
	var pgErr *pgconn.PgError
	return !errors.As(err, &pgErr) || connectionLost(pgErr)
}
