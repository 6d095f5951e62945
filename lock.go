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

// acquireSQL decides every case of an arriving request in one statement and
// one round trip:
//
//   - new key: `inserted` records it, locked, at the started recovery point;
//   - finished key (replay), other fingerprint, or live lock: `existing`
//     reports the row and nothing is written: the INSERT's SELECT yields no
//     row (so no tuple is built) and the UPDATE's quals fail;
//   - unlocked or stale key with the same fingerprint: `taken` renews the
//     lock token and resumes from the stored recovery point.
//
// `taken` re-checks its quals against the newest row version, so of two
// retries racing for a stale key only one wins. Two first requests racing
// for a new key meet in ON CONFLICT; the loser returns no row, which Run
// reports as in progress (the winner holds a fresh lock).
const acquireSQL = `
WITH existing AS (
    SELECT workflow, fingerprint, recovery_point, next_phase, state, lock_token,
           locked_at, response_status, response_header, response_body
    FROM idempotency_keys
    WHERE scope = $1 AND idempotency_key = $2
),
inserted AS (
    INSERT INTO idempotency_keys AS k
        (scope, idempotency_key, workflow, fingerprint, request_method, request_path, state, locked_at)
    SELECT $1, $2, $3, $4, $5, $6, $7, now()
    WHERE NOT EXISTS (SELECT FROM existing)
    ON CONFLICT (scope, idempotency_key) DO UPDATE
        SET locked_at = now(), lock_token = k.lock_token + 1, updated_at = now()
        WHERE k.response_status IS NULL AND k.workflow = $3 AND k.fingerprint = $4
          AND (k.locked_at IS NULL OR k.locked_at < now() - $8 * interval '1 microsecond')
    RETURNING k.workflow, k.fingerprint, k.recovery_point, k.next_phase, k.state, k.lock_token
),
taken AS (
    UPDATE idempotency_keys AS k
    SET locked_at = now(), lock_token = k.lock_token + 1, updated_at = now()
    WHERE k.scope = $1 AND k.idempotency_key = $2
      AND k.response_status IS NULL AND k.workflow = $3 AND k.fingerprint = $4
      AND (k.locked_at IS NULL OR k.locked_at < now() - $8 * interval '1 microsecond')
    RETURNING k.workflow, k.fingerprint, k.recovery_point, k.next_phase, k.state, k.lock_token
)
SELECT true AS acquired, workflow, fingerprint, recovery_point, next_phase, state, lock_token,
       NULL::float8 AS lock_expires_in, NULL::integer AS response_status,
       NULL::jsonb AS response_header, NULL::bytea AS response_body
FROM inserted
UNION ALL
SELECT true, workflow, fingerprint, recovery_point, next_phase, state, lock_token,
       NULL, NULL, NULL, NULL
FROM taken
UNION ALL
SELECT false, workflow, fingerprint, recovery_point, next_phase, NULL, lock_token,
       extract(epoch FROM locked_at + $8 * interval '1 microsecond' - now())::float8,
       response_status, response_header, response_body
FROM existing
WHERE NOT EXISTS (SELECT FROM taken)`

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
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// acquire runs acquireSQL. A nil row with a nil error means a racing first
// request won the insert.
func acquire(ctx context.Context, db querier, req *Request, workflow string, fp Fingerprint, state []byte, lockTimeout time.Duration) (*keyRow, error) {
	var rows []*keyRow
	err := pgxscan.Select(ctx, db, &rows, acquireSQL,
		req.Scope, req.Key, workflow, fp[:], req.Method, req.Path, state, lockTimeout.Microseconds())
	if err != nil || len(rows) == 0 {
		return nil, err
	}
	return rows[0], nil
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
