package atomicphase

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"math/rand/v2"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/internal/keystore"
)

// The key's lock, from the engine's side. A key is held while its lock is
// set and younger than Config.LockTimeout; an unfinished key that is
// unlocked, or whose lock is older (stale), may be taken by the next
// attempt. Every acquisition stores a lock token of its own, drawn at random
// by the attempt before it asks, and every phase commit checks it (fencing),
// so an attempt that was slow rather than dead cannot commit once another
// took the key. Knowing the token before the answer also lets an attempt
// whose acquisition answer was lost unlock the key by it. The statements
// are the key store's (internal/keystore); the stale-lock rule is written
// once, in SQL (migration 002). This file takes the key; release.go lets it
// go.

// acquire records or takes req's key in one statement (keystore.Acquire):
// the way in for every key that is not recorded with its first unit.
//
// When the answer is lost (the connection broke, or ctx ended, after the
// statement was sent), the key may have been recorded and locked under
// token with nobody to run it. acquire then unlocks it by token, best effort,
// so the retry the caller is told to make resumes at once instead of after
// the lock timeout; the error it returns is the acquisition's.
func (r *Runner) acquire(ctx context.Context, kr *keystore.Request) (*keystore.Row, error) {
	// The connection is taken first, so that failing to get one (the store
	// is down, ctx ended while the pool was exhausted) is known to have sent
	// nothing, and costs no unlock.
	conn, err := r.poolFor(kr.Scope).Acquire(ctx)
	if err != nil {
		return nil, err
	}
	if err := r.faultBeforeTake(ctx, kr.Workflow, conn, true); err != nil {
		return nil, err
	}
	row, err := r.store.Acquire(ctx, conn, kr)
	conn.Release() // before the unlock below, which needs a connection of its own
	if err != nil && answerMayBeLost(err) {
		if uerr := r.unlock(ctx, kr.Scope, kr.Key, kr.Token); uerr != nil {
			r.logKey(ctx, slog.LevelWarn, "atomicphase: unlock after a lost acquisition answer failed; the key is takeable after the lock timeout",
				kr.Workflow, kr.Scope, kr.Key, "error", uerr)
		}
	}
	return row, err
}

// newLockToken draws the lock token of one acquisition: random, positive
// and never 0, which atomicphase_acquire reports for a contended key.
func newLockToken() int64 {
	return rand.Int64N(math.MaxInt64-1) + 1
}

// take takes an unfinished key that nobody holds, for Resume and the
// sweep. It returns nil when the key is finished, held by a live attempt,
// or absent.
//
// A take whose answer was lost may have taken the key with nobody to run
// it: as after a lost acquisition answer, the key is unlocked by the token
// (which nobody else holds), so that the next attempt need not wait for the
// lease to end.
//
// workflow is the key's workflow as the caller knows it, "" when it does
// not: it names the fault point passed before the take.
func (r *Runner) take(ctx context.Context, workflow, scope, key string, token int64, sweep bool) (*keystore.Row, error) {
	conn, err := r.poolFor(scope).Acquire(ctx)
	if err != nil {
		return nil, err // nothing was sent
	}
	if err := r.faultBeforeTake(ctx, workflow, conn, true); err != nil {
		return nil, err
	}
	row, err := r.store.Take(ctx, conn, scope, key, token, sweep)
	conn.Release() // before the unlock below, which needs a connection of its own
	if err != nil && answerMayBeLost(err) {
		if uerr := r.unlock(ctx, scope, key, token); uerr != nil {
			r.logKey(ctx, slog.LevelWarn, "atomicphase: unlock after a lost take answer failed; the key is takeable when its lease ends",
				"", scope, key, "error", uerr)
		}
	}
	return row, err
}

// faultBeforeTake passes BeforeAcquire, holding conn, the connection about
// to send the statement that records or takes the key (passed to the
// injector when pass is set); conn is released when the injector fails the
// attempt or panics.
func (r *Runner) faultBeforeTake(ctx context.Context, workflow string, conn *pgxpool.Conn, pass bool) (err error) {
	if r.cfg.FaultInjector == nil {
		return nil
	}
	defer func() {
		if p := recover(); p != nil {
			conn.Release()
			panic(p)
		}
	}()
	var c *pgx.Conn
	if pass {
		c = conn.Conn()
	}
	if err := r.fault(ctx, workflow, "", BeforeAcquire, c); err != nil {
		conn.Release()
		return &injectedError{err}
	}
	return nil
}

// injectedError is a fault injected before the statement that records or
// takes a key was sent: nothing went out, and the caller returns the
// injector's error as it made it.
type injectedError struct{ err error }

func (e *injectedError) Error() string { return e.err.Error() }
func (e *injectedError) Unwrap() error { return e.err }

// injected returns the injector's error when err is an injectedError, or
// nil.
func injected(err error) error {
	var ie *injectedError
	if errors.As(err, &ie) {
		return ie.err
	}
	return nil
}
