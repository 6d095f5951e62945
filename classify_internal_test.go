package atomicphase

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// Each row of the classification table (docs/concepts.md, "Errors: one
// table"), as the engine meets it: a server error by SQLSTATE, a driver
// error, or an error of the phase's own.
func TestClassificationTable(t *testing.T) {
	t.Parallel()
	pg := func(code string) error {
		return fmt.Errorf("phase: %w", &pgconn.PgError{Severity: "ERROR", Code: code})
	}
	encode := errors.New("failed to encode args[0]: unable to encode map[string]interface {}{} into text format for unknown type (OID 0)")
	for _, row := range []struct {
		name      string
		err       error
		driverErr error
		connLost  bool
		fkRetries int
		want      errClass
	}{
		// Transient: retried.
		{name: "serialization failure", err: pg(pgerrcode.SerializationFailure), want: classConflict},
		{name: "deadlock", err: pg(pgerrcode.DeadlockDetected), want: classConflict},
		{name: "statement completion unknown", err: pg(pgerrcode.StatementCompletionUnknown), want: classTransient},
		{name: "lock timeout", err: pg(pgerrcode.LockNotAvailable), want: classTransient},
		{name: "statement timeout", err: pg(pgerrcode.QueryCanceled), want: classTransient},
		{name: "admin shutdown", err: pg(pgerrcode.AdminShutdown), want: classTransient},
		{name: "crash shutdown", err: pg(pgerrcode.CrashShutdown), want: classTransient},
		{name: "cannot connect now", err: pg(pgerrcode.CannotConnectNow), want: classTransient},
		{name: "idle session timeout", err: pg(pgerrcode.IdleSessionTimeout), want: classTransient},
		{name: "idle in transaction timeout", err: pg(pgerrcode.IdleInTransactionSessionTimeout), want: classTransient},
		{name: "read-only transaction (a standby after failover)", err: pg(pgerrcode.ReadOnlySQLTransaction), want: classTransient},
		{name: "connection exception", err: pg(pgerrcode.ConnectionFailure), want: classTransient},
		{name: "protocol violation", err: pg(pgerrcode.ProtocolViolation), want: classTransient},
		{name: "too many connections", err: pg(pgerrcode.TooManyConnections), want: classTransient},
		{name: "out of memory", err: pg(pgerrcode.OutOfMemory), want: classTransient},
		{name: "disk full", err: pg(pgerrcode.DiskFull), want: classTransient},
		{name: "FATAL of any code", err: &pgconn.PgError{Severity: "FATAL", Code: pgerrcode.InternalError}, want: classTransient},
		{name: "context cancelled", err: context.Canceled, want: classTransient},
		{name: "deadline exceeded", err: fmt.Errorf("x: %w", context.DeadlineExceeded), want: classTransient},
		{name: "driver: connection lost", err: io.ErrUnexpectedEOF, driverErr: io.ErrUnexpectedEOF, want: classTransient},
		{name: "driver: connection closed under it", err: errors.New("conn closed"), connLost: true, want: classTransient},
		{name: "the phase's own error", err: errors.New("bank: 503"), want: classTransient},
		{name: "foreign key, within the phase's retries", err: pg(pgerrcode.ForeignKeyViolation), fkRetries: 1, want: classTransient},

		// The request's own data: a final 422.
		{name: "foreign key", err: pg(pgerrcode.ForeignKeyViolation), want: classRequest},
		{name: "check", err: pg(pgerrcode.CheckViolation), want: classRequest},
		{name: "not null", err: pg(pgerrcode.NotNullViolation), want: classRequest},
		{name: "unique", err: pg(pgerrcode.UniqueViolation), want: classRequest},
		{name: "exclusion", err: pg(pgerrcode.ExclusionViolation), want: classRequest},
		{name: "numeric out of range", err: pg(pgerrcode.NumericValueOutOfRange), want: classRequest},
		{name: "invalid text representation", err: pg(pgerrcode.InvalidTextRepresentation), want: classRequest},
		{name: "division by zero", err: pg(pgerrcode.DivisionByZero), want: classRequest},

		// A programmer's or an operator's error: parked.
		{name: "Permanent", err: Permanent(errors.New("downstream says 400")), want: classPermanent},
		{name: "driver: encode error", err: fmt.Errorf("write audit: %w", encode), driverErr: encode, want: classPermanent},
		{name: "undefined table", err: pg(pgerrcode.UndefinedTable), want: classPermanent},
		{name: "undefined column", err: pg(pgerrcode.UndefinedColumn), want: classPermanent},
		{name: "syntax error", err: pg(pgerrcode.SyntaxError), want: classPermanent},
		{name: "prepared statement already exists", err: pg(pgerrcode.DuplicatePreparedStatement), want: classPermanent},
		{name: "prepared statement missing", err: pg(pgerrcode.InvalidSQLStatementName), want: classPermanent},
		{name: "insufficient privilege", err: pg(pgerrcode.InsufficientPrivilege), want: classPermanent},
		{name: "transaction aborted (an error swallowed)", err: pg(pgerrcode.InFailedSQLTransaction), want: classPermanent},
		{name: "feature not supported", err: pg(pgerrcode.FeatureNotSupported), want: classPermanent},
		{name: "internal error", err: pg(pgerrcode.InternalError), want: classPermanent},
		{name: "an unknown SQLSTATE", err: pg("ZZ999"), want: classPermanent},
	} {
		require.Equal(t, row.want, classify(row.err, row.driverErr, row.connLost, row.fkRetries, 1), row.name)
	}
	require.Equal(t, classRequest, classify(fmt.Errorf("x: %w", &pgconn.PgError{Code: pgerrcode.ForeignKeyViolation}), nil, false, 1, 2),
		"past the phase's foreign-key retries")
}

// Every permanent failure whose cause is known carries its fix.
func TestPermanentFailuresNameTheirFix(t *testing.T) {
	t.Parallel()
	encode := errors.New("failed to encode args[0]")
	for _, c := range []struct {
		err, driverErr error
		want           string
	}{
		{&pgconn.PgError{Code: pgerrcode.DuplicatePreparedStatement}, nil, "QueryExecModeExec"},
		{&pgconn.PgError{Code: pgerrcode.InvalidSQLStatementName}, nil, "transaction-pooling proxy"},
		{&pgconn.PgError{Code: pgerrcode.UndefinedColumn}, nil, "migrations"},
		{&pgconn.PgError{Code: pgerrcode.InsufficientPrivilege}, nil, "grant"},
		{fmt.Errorf("x: %w", encode), encode, "json.RawMessage"},
	} {
		err := diagnose(c.err, c.driverErr)
		require.ErrorIs(t, err, c.err)
		require.Contains(t, err.Error(), "(fix: ")
		require.Contains(t, err.Error(), c.want)
	}
	plain := errors.New("no fix known")
	require.Equal(t, plain, diagnose(plain, nil))
}
