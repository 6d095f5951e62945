package atomicphase

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/georgysavva/scany/v2/pgxscan"
	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"
)

// statements are the key store's SQL, rendered once for Config.Schema. The
// statement texts live beside the concept they serve: acquisition, taking
// and unlocking in lock.go, the checkpoint in recovery_point.go, inspection
// and the schema check here.
type statements struct {
	acquire, peek, record, ownedBy, take, release, checkpoint, inspect, checkSchema string
}

func newStatements(schema string) statements {
	return statements{
		acquire:     renderSQL(acquireSQL, schema),
		peek:        renderSQL(peekSQL, schema),
		record:      renderSQL(recordSQL, schema),
		ownedBy:     renderSQL(ownedBySQL, schema),
		take:        renderSQL(takeSQL, schema),
		release:     renderSQL(releaseSQL, schema),
		checkpoint:  renderSQL(checkpointSQL, schema),
		inspect:     renderSQL(inspectSQL, schema),
		checkSchema: checkSchemaSQL,
	}
}

// KeyInfo is what Inspect reports about a key.
type KeyInfo struct {
	Scope         string
	Key           string
	Workflow      string
	RecoveryPoint string
	// Status is where the key stands: in progress, stale, abandoned,
	// parked or finished.
	Status KeyStatus
	// Locked is true while the key's lock is set, held by a live attempt
	// (Status KeyInProgress) or left by a dead or slow one (KeyStale).
	Locked bool
	// LockExpiresIn is how long until a held lock goes stale, in seconds;
	// negative once it has.
	LockExpiresIn *float64
	// LockToken is the token of the latest acquisition (drawn at random).
	LockToken int64
	// State is the workflow state as of the last committed phase, the JSON
	// bytes exactly as stored. It is nil once the key is finished, unless
	// the workflow keeps it (WorkflowOpts.KeepFinishedState).
	State []byte
	// Attempts counts the acquisitions that took the key.
	Attempts int
	// LastError is why the key's last failed attempt failed.
	LastError *string
	// NextAttemptAt is when the sweep may try the key again after a failed
	// attempt; nil when it may at once.
	NextAttemptAt *time.Time
	// UnknownAt is when the outcome of the key's foreign call became
	// unknown; nil unless it is.
	UnknownAt *time.Time
	// ResolvedHappened, ResolvedNote and ResolvedAt record the last verdict
	// an operator gave by hand (Runner.RecordResolution); nil if none.
	ResolvedHappened *bool
	ResolvedNote     *string
	ResolvedAt       *time.Time
	// ParkedAt is when the key was parked (it failed permanently, or
	// Config.MaxAttempts times); nil unless it is.
	ParkedAt *time.Time
	// Response is the stored response once the key is finished.
	Response   *Response
	CreatedAt  time.Time
	UpdatedAt  time.Time
	FinishedAt *time.Time
}

// KeyStatus is where a key stands.
type KeyStatus string

// The statuses of a key.
const (
	// KeyInProgress: an attempt holds the key's lock, and it is not stale.
	KeyInProgress KeyStatus = "in_progress"
	// KeyStale: the key's lock is older than the lock timeout: its holder
	// died or is slow, and the next retry or sweep takes it over.
	KeyStale KeyStatus = "stale"
	// KeyAbandoned: unfinished and unlocked: its last attempt failed (or
	// was cancelled), and a retry or the sweep resumes it.
	KeyAbandoned KeyStatus = "abandoned"
	// KeyUnknown: unfinished and unlocked, waiting for reconciliation: a
	// call to a downstream without idempotency keys may or may not have
	// taken effect. The sweep or a retry reconciles it after NextAttemptAt;
	// ResolveUnknown settles it from outside.
	KeyUnknown KeyStatus = "unknown"
	// KeyParked: unfinished, unlocked and left for an operator; the sweep
	// does not try it, a client retry still resumes it.
	KeyParked KeyStatus = "parked"
	// KeyFinished: the response is stored and replayed.
	KeyFinished KeyStatus = "finished"
)

// keyStatusSQL computes KeyStatus in SQL ($3 is the lock timeout in µs).
const keyStatusSQL = `CASE
    WHEN response_status IS NOT NULL THEN 'finished'
    WHEN parked_at IS NOT NULL THEN 'parked'
    WHEN unknown_at IS NOT NULL AND locked_at IS NULL THEN 'unknown'
    WHEN locked_at IS NULL THEN 'abandoned'
    WHEN /* TEMPLATE: schema */atomicphase_lock_takeable(locked_at, /* TEMPLATE: schema */atomicphase_stale_before($3)) THEN 'stale'
    ELSE 'in_progress' END`

// keyInfoColumns are the columns a KeyInfo is scanned from.
const keyInfoColumns = `scope, idempotency_key AS key, workflow, recovery_point,
       ` + keyStatusSQL + ` AS status,
       locked_at IS NOT NULL AS locked, lock_token, state, attempts, last_error,
       next_attempt_at, parked_at, unknown_at, resolved_happened, resolved_note, resolved_at,
       extract(epoch FROM locked_at - /* TEMPLATE: schema */atomicphase_stale_before($3))::float8 AS lock_expires_in,
       response_status AS status_code, response_header AS header, response_body AS body,
       created_at, updated_at, finished_at`

const inspectSQL = `SELECT ` + keyInfoColumns + `
FROM /* TEMPLATE: schema */idempotency_keys WHERE scope = $1 AND idempotency_key = $2`

// Inspect reads a key's stored row without locking or changing it, for
// operators and tests. A key never recorded returns ErrKeyNotFound.
func (r *Runner) Inspect(ctx context.Context, scope, key string) (*KeyInfo, error) {
	var row keyInfoRow
	err := pgxscan.Get(ctx, r.pool, &row, r.sql.inspect, scope, key, r.cfg.LockTimeout.Microseconds())
	if pgxscan.NotFound(err) {
		return nil, ErrKeyNotFound
	}
	if err != nil {
		return nil, storeError("inspect key", err)
	}
	return row.info(), nil
}

// keyInfoRow is a KeyInfo as keyInfoColumns read it.
type keyInfoRow struct {
	KeyInfo
	StatusCode *int
	Header     http.Header
	Body       []byte
}

func (row *keyInfoRow) info() *KeyInfo {
	info := row.KeyInfo
	if row.StatusCode != nil {
		info.Response = &Response{Status: *row.StatusCode, Header: row.Header, Body: row.Body, Replayed: true}
	}
	return &info
}

// schemaObjects are the tables and functions this version of the library
// uses, as to_regclass and to_regprocedure name them. CheckSchema looks for
// each; keep the list in step with the newest migration.
var schemaObjects = []struct{ kind, name string }{
	{"table", "idempotency_keys"},
	{"column", "idempotency_keys.unknown_at"},
	{"function", "atomicphase_acquire(text, text, text, bytea, text, text, bytea, bigint, bigint, integer)"},
	{"function", "atomicphase_checkpoint(text, text, bigint, text, text, bytea, integer, jsonb, bytea)"},
	{"function", "atomicphase_stale_before(bigint)"},
	{"function", "atomicphase_lock_takeable(timestamptz, timestamptz)"},
	{"function", "atomicphase_record(text, text, text, bytea, text, text, bytea, bigint, integer)"},
	{"function", "atomicphase_take(text, text, bigint, bigint, boolean)"},
	{"function", "atomicphase_release(text, text, bigint, text, bigint, boolean, boolean)"},
	{"function", "atomicphase_unpark(text, text)"},
	{"function", "atomicphase_record_resolution(text, text, boolean, text, bigint)"},
}

const checkSchemaSQL = `
SELECT coalesce(array_agg(o.name ORDER BY o.ord), '{}')
FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS o(kind, name, ord)
WHERE CASE o.kind
        WHEN 'table' THEN to_regclass(o.name) IS NULL
        WHEN 'column' THEN NOT EXISTS (
            SELECT FROM pg_attribute
            WHERE attrelid = to_regclass(substring(o.name FROM '^(.*)\.[^.]*$'))
              AND attname = substring(o.name FROM '[^.]*$') AND NOT attisdropped)
        ELSE to_regprocedure(o.name) IS NULL END`

// CheckSchema reports whether the database has the key table and functions
// this version of the library needs, in Config.Schema. Call it at start-up:
// it returns nil when all is there, an error wrapping ErrSchemaMissing that
// names what is missing and says to run Migrate when not, and a store error
// when the database cannot be asked. It reads the catalog and writes
// nothing.
func (r *Runner) CheckSchema(ctx context.Context) error {
	kinds := make([]string, len(schemaObjects))
	names := make([]string, len(schemaObjects))
	q := qualifier(r.cfg.Schema)
	for i, o := range schemaObjects {
		kinds[i], names[i] = o.kind, q+o.name
	}
	var missing []string
	if err := r.pool.QueryRow(ctx, r.sql.checkSchema, kinds, names).Scan(&missing); err != nil {
		return storeError("check schema", err)
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: missing %s; run atomicphase.Migrate (or apply schema.sql)%s",
			ErrSchemaMissing, strings.Join(missing, ", "), schemaHint(r.cfg.Schema))
	}
	return nil
}

func schemaHint(schema string) string {
	if schema == "" {
		return " on the connection's search_path"
	}
	return fmt.Sprintf(" with MigrateOpts.Schema %q", schema)
}

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
