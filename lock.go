package atomicphase

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// The key's lock. A key is held while its locked_at is set and younger than
// the lock timeout; an unfinished key that is unlocked, or whose lock is
// older (stale), may be taken by the next attempt. Every acquisition stores
// a lock token of its own, drawn at random by the attempt before it asks, and
// every phase commit checks it (fencing), so an attempt that was slow rather
// than dead cannot commit once another took the key. Knowing the token
// before the answer also lets an attempt whose acquisition answer was lost
// unlock the key by it. The stale-lock rule itself is written once, in SQL:
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
	DownstreamSalt *string  // salts the row's downstream keys; nil on rows older than migration 003
	Attempts       int      // acquisitions of the key so far, this one included
	TookOver       bool     // this acquisition took a stale lock
	OverLimit      bool     // a new key refused: its scope has too many unfinished keys
	ResponseStatus *int
	ResponseHeader []byte // JSON text, decoded only for a replay
	ResponseBody   []byte
}

// acquireSQL records or takes the key, or reports why not, in one statement
// and one round trip (see atomicphase_acquire in schema.sql). A replay reads
// the row by primary key and writes nothing. The casts name every
// parameter's type, so the call resolves the same in every pgx query exec
// mode (behind PgBouncer, say), where parameter types are not described by
// the server.
const acquireSQL = `SELECT * FROM /* TEMPLATE: schema */atomicphase_acquire(
	$1::text, $2::text, $3::text, $4::bytea, $5::text, $6::text, $7::bytea, $8::bigint, $9::bigint, $10::integer)`

// peekSQL reads what a request needs to know about its key before it
// runs: whether the key exists, and when it does, whether it was used with
// another request, its stored response, and whether a live attempt holds
// it. It is the whole of a replay: one primary-key read, written to nothing.
const peekSQL = `
SELECT workflow = $4::text AND fingerprint = $5::bytea, response_status, response_header::text, response_body,
       /* TEMPLATE: schema */atomicphase_lock_takeable(locked_at, /* TEMPLATE: schema */atomicphase_stale_before($3)),
       extract(epoch FROM locked_at - /* TEMPLATE: schema */atomicphase_stale_before($3))::float8
FROM /* TEMPLATE: schema */idempotency_keys
WHERE scope = $1 AND idempotency_key = $2`

// recordSQL records a new key, locked under the caller's lock token, inside
// the transaction of the workflow's first phase (phase fusion): the key
// and the phase's writes commit together. It records nothing when the key
// exists, having waited for an attempt recording it at the same moment to
// commit or roll back; the caller then acquires the key on its own
// (acquireSQL), which explains why. See atomicphase_record in schema.sql:
// the function takes the lock time on the node that holds the row.
const recordSQL = `SELECT downstream_salt::text FROM /* TEMPLATE: schema */atomicphase_record(
	$1::text, $2::text, $3::text, $4::bytea, $5::text, $6::text, $7::bytea, $8::bigint, NULL::integer)`

// ownedBySQL reports whether a key holds the lock token $3.
const ownedBySQL = `SELECT lock_token = $3 FROM /* TEMPLATE: schema */idempotency_keys WHERE scope = $1 AND idempotency_key = $2`

// peeked is what peekSQL read about an existing key.
type peeked struct {
	keyRow
	// same is true when the key was recorded for this workflow and a
	// request with this fingerprint (compared by the server, so neither
	// travels back).
	same     bool
	takeable bool
}

// peek reads the request's key on conn. found is false when the key does
// not exist.
//
// It is the whole of a replay, so it scans into values rather than
// pointers, and takes the lock timeout boxed once (r.lockTimeoutArg).
func (r *Runner) peek(ctx context.Context, conn *pgx.Conn, req *Request, workflow string, fp *Fingerprint) (p peeked, found bool, err error) {
	var status pgtype.Int4
	var expiresIn pgtype.Float8
	err = conn.QueryRow(ctx, r.sql.peek, req.Scope, req.Key, r.lockTimeoutArg, workflow, fp[:]).
		Scan(&p.same, &status, &p.ResponseHeader, &p.ResponseBody, &p.takeable, &expiresIn)
	if errors.Is(err, pgx.ErrNoRows) {
		return p, false, nil
	}
	if err != nil {
		return p, false, err
	}
	if status.Valid {
		s := int(status.Int32)
		p.ResponseStatus = &s
	}
	if expiresIn.Valid {
		p.LockExpiresIn = &expiresIn.Float64
	}
	return p, true, nil
}

// recording is a new key's recording, sent at the head of the first
// phase's transaction (phaseTx.rec).
type recording struct {
	sql  string
	args []any
	// sent and recorded say how its latest sending went: recorded is
	// false when the key existed.
	sent, recorded bool
	// announced is set once the key's creation was reported (when the
	// transaction that recorded it committed).
	announced bool
	// salt is the new row's downstream salt.
	salt string
}

// errNotRecorded stops a transaction whose recording found the key
// already there: the attempt ran on the assumption of a new key, and the
// key is acquired on its own instead.
var errNotRecorded = errors.New("atomicphase: the key was recorded meanwhile")

// read reads the recording's answer from br.
func (rec *recording) read(br pgx.BatchResults) error {
	rec.sent, rec.recorded = true, false
	err := br.QueryRow().Scan(&rec.salt)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return errNotRecorded
	case err != nil:
		return err
	}
	rec.recorded = true
	return nil
}

// newRecording makes the recording of req's key under token.
func (r *Runner) newRecording(req *Request, workflow string, fp Fingerprint, state []byte, token int64) *recording {
	return &recording{sql: r.sql.record,
		args: []any{req.Scope, req.Key, workflow, fp[:], req.Method, req.Path, state, token}}
}

// takeSQL takes an unfinished key that is unlocked or stale, without a
// request at hand, under the caller's lock token. For the sweep ($5) it
// also re-checks what made the key due when the sweep picked it: not parked,
// past its backoff. See atomicphase_take in schema.sql.
const takeSQL = `SELECT * FROM /* TEMPLATE: schema */atomicphase_take($1::text, $2::text, $3::bigint, $4::bigint, $5::boolean)`

// releaseSQL releases a lock this attempt holds, leaving the recovery point
// where the last committed phase put it. With an error ($4) it records why
// the attempt failed and when the sweep may try the key again ($5
// microseconds from now); with $6 it parks the key for an operator. Like a
// checkpoint it is fenced by the token: a release by an attempt that lost
// the key changes nothing. See atomicphase_release in schema.sql: it
// returns a row, and the statement's tag counts one, when it released the
// lock.
const releaseSQL = `SELECT * FROM /* TEMPLATE: schema */atomicphase_release(
	$1::text, $2::text, $3::bigint, $4::text, $5::bigint, $6::boolean, $7::boolean)`

// maxLastError bounds the error text stored on a key.
const maxLastError = 2000

// lockLostCode is the SQLSTATE atomicphase_checkpoint raises when the lock
// token moved on: the fencing check failed.
const lockLostCode = "AP001"

// cleanupTimeout bounds the unlock and rollback that follow a failed phase,
// which run even when the caller's context has ended.
const cleanupTimeout = 5 * time.Second

// acquire runs acquireSQL. It is the hot path of every request, so it scans
// positionally: struct scanning by reflection cost a fifth of a replay's
// client CPU in BenchmarkReplay.
//
// When the answer is lost (the connection broke, or ctx ended, after the
// statement was sent), the key may have been recorded and locked under
// token with nobody to run it. acquire then unlocks it by token, best effort,
// so the retry the caller is told to make resumes at once instead of after
// the lock timeout; the error it returns is the acquisition's.
func (r *Runner) acquire(ctx context.Context, req *Request, workflow string, fp Fingerprint, state []byte, token int64) (*keyRow, error) {
	// The connection is taken first, so that failing to get one (the store
	// is down, ctx ended while the pool was exhausted) is known to have sent
	// nothing, and costs no unlock.
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	var row keyRow
	err = conn.QueryRow(ctx, r.sql.acquire,
		req.Scope, req.Key, workflow, fp[:], req.Method, req.Path, state, r.cfg.LockTimeout.Microseconds(), token,
		r.maxUnfinished(),
	).Scan(&row.Acquired, &row.Workflow, &row.Fingerprint, &row.RecoveryPoint, &row.JumpTarget,
		&row.State, &row.LockToken, &row.LockExpiresIn, &row.DownstreamSalt,
		&row.Attempts, &row.TookOver, &row.OverLimit,
		&row.ResponseStatus, &row.ResponseHeader, &row.ResponseBody)
	conn.Release() // before the unlock below, which needs a connection of its own
	if err != nil {
		if answerMayBeLost(err) {
			if uerr := r.unlock(ctx, req.Scope, req.Key, token); uerr != nil {
				r.logKey(ctx, slog.LevelWarn, "atomicphase: unlock after a lost acquisition answer failed; the key is takeable after the lock timeout",
					workflow, req.Scope, req.Key, "error", uerr)
			}
		}
		return nil, err
	}
	return &row, nil
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

// newLockToken draws the lock token of one acquisition: random, positive
// and never 0, which atomicphase_acquire reports for a contended key.
func newLockToken() int64 {
	return rand.Int64N(math.MaxInt64-1) + 1
}

// take takes an unfinished key that nobody holds, for Resume. It returns nil
// when the key is finished, held by a live attempt, or absent.
func (r *Runner) take(ctx context.Context, scope, key string, token int64, sweep bool) (*keyRow, error) {
	row := keyRow{Acquired: true}
	err := r.pool.QueryRow(ctx, r.sql.take, scope, key, r.cfg.LockTimeout.Microseconds(), token, sweep).
		Scan(&row.Workflow, &row.RecoveryPoint, &row.JumpTarget, &row.State, &row.LockToken, &row.DownstreamSalt, &row.Attempts,
			&row.TookOver)
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
	_, err := r.release(ctx, scope, key, token, nil, 0, false, false)
	return err
}

// release unlocks the key an attempt holds with token. When why is set it
// records the error and, unless park, when the sweep may try the key again
// (retryIn from now); park marks the key parked for an operator; unknown
// marks the outcome of its foreign call unknown. Like unlock it runs even
// when ctx has ended.
//
// It reports whether it released anything: false when the token had moved
// on (another attempt took the key) or the key finished meanwhile.
func (r *Runner) release(ctx context.Context, scope, key string, token int64, why error, retryIn time.Duration, park, unknown bool) (bool, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	var msg *string
	var retryInUS *int64
	if why != nil {
		m := boundedError(why)
		msg = &m
		if !park {
			us := retryIn.Microseconds()
			retryInUS = &us
		}
	}
	tag, err := r.pool.Exec(ctx, r.sql.release, scope, key, token, msg, retryInUS, park, unknown)
	return tag.RowsAffected() == 1, err
}

// boundedError is err's text as a key row keeps it: valid UTF-8 without NUL,
// at most maxLastError bytes.
func boundedError(err error) string {
	msg := strings.ToValidUTF8(strings.ReplaceAll(err.Error(), "\x00", ""), "?")
	if len(msg) > maxLastError {
		msg = strings.ToValidUTF8(msg[:maxLastError], "") + "…"
	}
	return msg
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
