package atomicphase

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The key's lock. A key is held while its locked_at is set and younger than
// the lock timeout; an unfinished key that is unlocked, or whose lock is
// older (stale), may be taken by the next attempt. Every acquisition renews
// the key's lock token, and every phase commit checks it (fencing), so an
// attempt that was slow rather than dead cannot commit once another took
// the key. The stale-lock rule itself is written once, in SQL:
// atomicphase_stale_before turns the lock timeout into a cut-off and
// atomicphase_lock_takeable applies it (migration 002).

// keyRow is what an acquisition reads back about a key.
type keyRow struct {
	// Acquired is true when this statement took the lock.
	Acquired       bool
	Workflow       string
	Fingerprint    []byte
	RecoveryPoint  string
	JumpTarget     *string // the phase to run next when the last one jumped
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
const acquireSQL = `SELECT * FROM /* TEMPLATE: schema */atomicphase_acquire($1, $2, $3, $4, $5, $6, $7, $8)`

// takeSQL takes an unfinished key that is unlocked or stale, without a
// request at hand, renewing its lock token.
const takeSQL = `
UPDATE /* TEMPLATE: schema */idempotency_keys AS k
SET locked_at = now(), lock_token = k.lock_token + 1, updated_at = now()
WHERE k.scope = $1 AND k.idempotency_key = $2 AND k.response_status IS NULL
  AND /* TEMPLATE: schema */atomicphase_lock_takeable(k.locked_at, /* TEMPLATE: schema */atomicphase_stale_before($3))
RETURNING k.workflow, k.recovery_point, k.next_phase, k.state, k.lock_token`

// unlockSQL releases a lock this attempt holds, leaving the recovery point
// where the last committed phase put it.
const unlockSQL = `
UPDATE /* TEMPLATE: schema */idempotency_keys SET locked_at = NULL, updated_at = now()
WHERE scope = $1 AND idempotency_key = $2 AND lock_token = $3 AND response_status IS NULL`

// lockLostCode is the SQLSTATE atomicphase_checkpoint raises when the lock
// token moved on: the fencing check failed.
const lockLostCode = "AP001"

// cleanupTimeout bounds the unlock and rollback that follow a failed phase,
// which run even when the caller's context has ended.
const cleanupTimeout = 5 * time.Second

// acquire runs acquireSQL. It is the hot path of every request, so it scans
// positionally: struct scanning by reflection cost a fifth of a replay's
// client CPU in BenchmarkReplay.
func (r *Runner) acquire(ctx context.Context, req *Request, workflow string, fp Fingerprint, state []byte) (*keyRow, error) {
	var row keyRow
	err := r.pool.QueryRow(ctx, r.sql.acquire,
		req.Scope, req.Key, workflow, fp[:], req.Method, req.Path, state, r.cfg.LockTimeout.Microseconds(),
	).Scan(&row.Acquired, &row.Workflow, &row.Fingerprint, &row.RecoveryPoint, &row.JumpTarget,
		&row.State, &row.LockToken, &row.LockExpiresIn, &row.ResponseStatus, &row.ResponseHeader, &row.ResponseBody)
	if err != nil {
		return nil, err
	}
	return &row, nil
}

// take takes an unfinished key that nobody holds, for Resume. It returns nil
// when the key is finished, held by a live attempt, or absent.
func (r *Runner) take(ctx context.Context, scope, key string) (*keyRow, error) {
	row := keyRow{Acquired: true}
	err := r.pool.QueryRow(ctx, r.sql.take, scope, key, r.cfg.LockTimeout.Microseconds()).
		Scan(&row.Workflow, &row.RecoveryPoint, &row.JumpTarget, &row.State, &row.LockToken)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &row, nil
}

// unlock releases the lock an attempt holds with token, so the next attempt
// can resume at once. It runs even when ctx has ended (a cancelled request
// must not leave its key locked for the lock timeout), bounded by
// cleanupTimeout. An unlock with a token that moved on changes nothing.
func (r *Runner) unlock(ctx context.Context, scope, key string, token int64) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	_, err := r.pool.Exec(ctx, r.sql.unlock, scope, key, token)
	return err
}

// inProgress is the error for a key held by another attempt whose lock goes
// stale in expiresInSeconds (nil when unknown).
func inProgress(expiresInSeconds *float64) error {
	e := &InProgressError{RetryAfter: time.Second}
	if expiresInSeconds != nil {
		e.LockExpiresIn = max(0, time.Duration(*expiresInSeconds*float64(time.Second)))
		e.RetryAfter = min(e.RetryAfter, e.LockExpiresIn)
	}
	return e
}

// isLockLost reports the fencing failure atomicphase_checkpoint raises.
func isLockLost(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == lockLostCode
}
