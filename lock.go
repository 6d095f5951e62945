package atomicphase

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/georgysavva/scany/v2/pgxscan"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// keyRow is what an acquisition reads back about a key.
type keyRow struct {
	// Acquired is true when this statement took the lock.
	Acquired       bool
	Workflow       string
	Fingerprint    []byte
	RecoveryPoint  string
	NextPhase      *string
	State          []byte
	LockToken      int64
	LockExpiresIn  *float64 // seconds until a live lock goes stale
	ResponseStatus *int
	ResponseHeader http.Header
	ResponseBody   []byte
}

// acquireSQL records or takes the key, or reports why not, in one statement
// and one round trip (see atomicphase_acquire in schema.sql). A replay reads
// the row by primary key and writes nothing.
const acquireSQL = `SELECT * FROM atomicphase_acquire($1, $2, $3, $4, $5, $6, $7, $8)`

// resumeSQL takes an unfinished key that is unlocked or stale, without a
// request at hand.
const resumeSQL = `
UPDATE idempotency_keys AS k
SET locked_at = now(), lock_token = k.lock_token + 1, updated_at = now()
WHERE k.scope = $1 AND k.idempotency_key = $2 AND k.response_status IS NULL
  AND (k.locked_at IS NULL OR k.locked_at < now() - $3 * interval '1 microsecond')
RETURNING true AS acquired, k.workflow, k.fingerprint, k.recovery_point, k.next_phase,
          k.state, k.lock_token`

// checkpointSQL advances the recovery point if, and only if, the lock token
// still matches (see atomicphase_checkpoint in schema.sql).
const checkpointSQL = `SELECT atomicphase_checkpoint($1, $2, $3, $4, $5, $6, $7, $8, $9)`

// unlockSQL releases a lock this attempt holds, leaving the recovery point
// where the last committed phase put it.
const unlockSQL = `
UPDATE idempotency_keys SET locked_at = NULL, updated_at = now()
WHERE scope = $1 AND idempotency_key = $2 AND lock_token = $3 AND response_status IS NULL`

// lockLostCode is the SQLSTATE atomicphase_checkpoint raises.
const lockLostCode = "AP001"

// querier is the part of a pool, connection or transaction the lock
// statements need.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// acquire runs acquireSQL. It is the hot path of every request, so it scans
// positionally: struct scanning by reflection cost a fifth of a replay's
// client CPU in BenchmarkReplay.
func acquire(ctx context.Context, db querier, req *Request, workflow string, fp Fingerprint, state []byte, lockTimeout time.Duration) (*keyRow, error) {
	var row keyRow
	err := db.QueryRow(ctx, acquireSQL,
		req.Scope, req.Key, workflow, fp[:], req.Method, req.Path, state, lockTimeout.Microseconds(),
	).Scan(&row.Acquired, &row.Workflow, &row.Fingerprint, &row.RecoveryPoint, &row.NextPhase,
		&row.State, &row.LockToken, &row.LockExpiresIn, &row.ResponseStatus, &row.ResponseHeader, &row.ResponseBody)
	if err != nil {
		return nil, err
	}
	return &row, nil
}

func resumeKey(ctx context.Context, db querier, scope, key string, lockTimeout time.Duration) (*keyRow, error) {
	var rows []*keyRow
	if err := pgxscan.Select(ctx, db, &rows, resumeSQL, scope, key, lockTimeout.Microseconds()); err != nil || len(rows) == 0 {
		return nil, err
	}
	return rows[0], nil
}

func unlock(ctx context.Context, db querier, scope, key string, token int64) error {
	_, err := db.Exec(ctx, unlockSQL, scope, key, token)
	return err
}

// checkpointArgs are atomicphase_checkpoint's arguments for a phase commit.
func checkpointArgs(scope, key string, token int64, point, next string, state []byte, resp *Response) []any {
	var nextArg *string
	if next != "" {
		nextArg = &next
	}
	args := []any{scope, key, token, point, nextArg, state, nil, nil, nil}
	if resp != nil {
		var header http.Header
		if len(resp.Header) > 0 {
			header = resp.Header
		}
		body := resp.Body
		if body == nil {
			body = []byte{}
		}
		args[6], args[7], args[8] = resp.Status, header, body
	}
	return args
}

func isLockLost(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == lockLostCode
}

// retryableSQLState reports serialization failures and deadlocks: the
// transient conflicts a phase is retried for.
func retryableSQLState(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01")
}
