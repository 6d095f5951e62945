package atomicphase

import (
	"context"
	"errors"
	"fmt"

	"io"
	"net"

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

// The classification of a phase's failure: one table, written as an
// allow-list. What the table names as transient is retried (the request
// may succeed later, unchanged); a database's refusal of the request's own
// data is the request's final answer (422, stored and replayed); anything
// else the database or the driver raised is a programmer's or an
// operator's error, which the same request meets on every retry: the key
// is parked, loudly, with the cause and the fix. An error a phase returns
// that came from neither (a downstream's answer, a phase's own check) is
// the phase's to mark: transient unless wrapped with Permanent.
// docs/concepts.md ("Errors: one table") gives each row with its reason.

// errClass is what a phase's failure means for its request.
type errClass int

const (
	// classTransient: retried by the client (503) or the sweep, up to
	// Config.MaxAttempts.
	classTransient errClass = iota
	// classConflict: transient, and retried in place at once, up to
	// Config.PhaseRetries: a serialization failure or a deadlock.
	classConflict
	// classRequest: the request's own data was refused: a final 422.
	classRequest
	// classPermanent: a programmer's or an operator's error: parked, 500.
	classPermanent
)

// transientCode reports whether a server error with SQLSTATE code is on
// the allow-list of transient failures, and why.
func transientCode(code string) (why string, ok bool) {
	switch code {
	case pgerrcode.SerializationFailure, pgerrcode.DeadlockDetected:
		return "a conflict with a concurrent transaction; the same transaction may commit when run again", true
	case pgerrcode.StatementCompletionUnknown:
		return "the server could not tell whether the transaction committed", true
	case pgerrcode.LockNotAvailable:
		return "lock_timeout (or NOWAIT) expired waiting for a lock another transaction held", true
	case pgerrcode.QueryCanceled:
		return "statement_timeout expired, or the statement was cancelled", true
	case pgerrcode.AdminShutdown, pgerrcode.CrashShutdown, pgerrcode.CannotConnectNow,
		pgerrcode.IdleSessionTimeout, pgerrcode.IdleInTransactionSessionTimeout:
		return "the server ended the session (shutdown, restart, recovery, a session timeout)", true
	case pgerrcode.ReadOnlySQLTransaction:
		return "the connection reached a standby (a failover is under way)", true
	}
	switch {
	case pgerrcode.IsConnectionException(code):
		return "the connection broke", true
	case pgerrcode.IsInsufficientResources(code):
		return "the server lacked a resource for now: connections, memory, disk", true
	}
	return "", false
}

// requestCode reports whether a server error with SQLSTATE code refuses
// the request's own data: a data exception (class 22: a value out of
// range, malformed, a division by zero) or an integrity constraint (class
// 23: NOT NULL, CHECK, UNIQUE, a foreign key, an exclusion).
func requestCode(code string) bool {
	return pgerrcode.IsDataException(code) || pgerrcode.IsIntegrityConstraintViolation(code)
}

// classify says what a phase's failure err means. driverErr is the first
// error the phase's transaction returned to the phase (nil if none):
// err came from the driver when it wraps it. fkRetries is how many of the
// key's attempts may take a foreign-key violation for a race
// (Phase.WithForeignKeyRetries); attempts counts the key's attempts, this
// one included.
func classify(err, driverErr error, connLost bool, fkRetries, attempts int) errClass {
	if errors.Is(err, ErrPermanent) {
		return classPermanent
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return classTransient
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case pgErr.Code == pgerrcode.SerializationFailure || pgErr.Code == pgerrcode.DeadlockDetected:
			return classConflict
		case connectionLost(pgErr):
			return classTransient
		case pgErr.Code == pgerrcode.ForeignKeyViolation && attempts <= fkRetries:
			return classTransient
		case requestCode(pgErr.Code):
			return classRequest
		}
		if _, ok := transientCode(pgErr.Code); ok {
			return classTransient
		}
		return classPermanent
	}
	if driverErr == nil || !errors.Is(err, driverErr) {
		// Not the database's: the phase's own error, transient unless it
		// says otherwise (Permanent, above).
		return classTransient
	}
	if connLost || driverConnLost(err) {
		return classTransient
	}
	// The driver refused before the server saw the statement (a value it
	// cannot encode, say): the same code meets it every time.
	return classPermanent
}

// classifyUnit classifies a unit's failure, charged to the phase it
// happened in.
func (a *attempt) classifyUnit(ue *unitError) errClass {
	fkRetries := 0
	steps := a.wf.phaseSteps()
	for i := range steps {
		if steps[i].name == ue.phase {
			fkRetries = steps[i].fkRetries
		}
	}
	return classify(ue.err, ue.driverErr, ue.connLost, fkRetries, a.attempts)
}

// driverConnLost reports a driver error that says the connection was lost
// or never made: a network error, an unexpected end of the stream, a
// failed connect, a timeout.
func driverConnLost(err error) bool {
	var netErr net.Error
	var connectErr *pgconn.ConnectError
	return errors.As(err, &netErr) || errors.As(err, &connectErr) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		pgconn.Timeout(err) || pgconn.SafeToRetry(err)
}

// isConflict reports serialization failures and deadlocks: the transient
// conflicts a phase's transaction is retried for.
func isConflict(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) &&
		(pgErr.Code == pgerrcode.SerializationFailure || pgErr.Code == pgerrcode.DeadlockDetected)
}

// diagnose adds to a permanent failure the fix an operator needs, when the
// error is one whose cause is known: a driver that cannot encode a value,
// a statement cache behind a transaction-pooling proxy, a schema older
// than the code, a missing privilege.
func diagnose(err error, driverErr error) error {
	if fix := fixFor(err, driverErr); fix != "" {
		return &diagnosedError{err: err, fix: fix}
	}
	return err
}

// fixFor is the fix for a permanent failure whose cause is known; "" when
// it is not.
func fixFor(err, driverErr error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case pgerrcode.DuplicatePreparedStatement, pgerrcode.InvalidSQLStatementName:
			return "prepared statements do not outlive a transaction behind a transaction-pooling proxy (PgBouncer): " +
				"set the pool's pgx DefaultQueryExecMode to QueryExecModeExec or QueryExecModeCacheDescribe " +
				"(default_query_exec_mode=exec in the connection string), or enable the proxy's prepared statement support, " +
				"then unpark the key"
		case pgerrcode.UndefinedTable, pgerrcode.UndefinedColumn, pgerrcode.UndefinedFunction, pgerrcode.UndefinedObject:
			return "the database's schema is older (or other) than the code's: apply the application's migrations, then unpark the key"
		case pgerrcode.InsufficientPrivilege:
			return "the application's role lacks a privilege: grant it, then unpark the key"
		}
		return ""
	}
	if driverErr != nil && errors.Is(err, driverErr) {
		return "the driver could not send a value of the statement (it never reached the server): " +
			"under pgx's exec and simple_protocol modes a Go map or struct cannot be encoded for a json or jsonb parameter; " +
			"pass json.RawMessage, []byte or a string of JSON (or the value pgx's type map registers), then unpark the key"
	}
	return ""
}

// diagnosedError is a permanent failure with its fix, which its text
// carries to the key's last error, the log and the event.
type diagnosedError struct {
	err error
	fix string
}

func (e *diagnosedError) Error() string { return e.err.Error() + " (fix: " + e.fix + ")" }
func (e *diagnosedError) Unwrap() error { return e.err }

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
