package atomicphase_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

// Leases that run late on this side: a renewal stuck behind a busy pool,
// a call's mark whose answer was lost. Neither may cost a call's result or
// hold the key longer than the work needs.

// waitLeaseEnded waits, in the phase's own transaction, until the
// database holds the key's lease as ended: the unit outlasted its lease
// without a renewal taking (the only connection of the pool is the
// unit's own, so no renewal can get one).
func waitLeaseEnded(ctx context.Context, tx atomicphase.Tx, scope, key string) error {
	for {
		var ended bool
		if err := tx.QueryRow(ctx, `SELECT locked_at + lease_us * interval '1 microsecond' < clock_timestamp()
			FROM idempotency_keys WHERE scope = $1 AND idempotency_key = $2`, scope, key).Scan(&ended); err != nil {
			return err
		}
		if ended {
			return nil
		}
		if _, err := tx.Exec(ctx, `SELECT pg_sleep(0.01)`); err != nil {
			return err
		}
	}
}

// A unit that outlasts its lease while the pool is too busy for a renewal
// (here a pool of one connection, which the unit holds) keeps its work:
// nobody took the key, so its commit, fenced by the token, goes through,
// and the foreign call before it is not sent again. Before, every attempt
// failed with "the lease could not be renewed before it ended", dropped
// the call's result, and the retries sent the call again.
func TestLeaseRenewalBehindABusyPoolLosesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	pcfg, err := pgxpool.ParseConfig(b.db.URL)
	require.NoError(t, err)
	pcfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(b.ctx, pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	r, err := atomicphase.NewRunner(pool, &atomicphase.Config{LockTimeout: 300 * time.Millisecond})
	require.NoError(t, err)
	var calls atomic.Int32
	wf := atomicphase.MustWorkflow("busy", startEmpty[struct{}], []atomicphase.Phase[struct{}]{
		atomicphase.Local("record", func(ctx context.Context, tx atomicphase.Tx, _ *struct{}) (atomicphase.Outcome, error) {
			return atomicphase.Continue(), nil
		}),
		atomicphase.Foreign("charge", func(ctx context.Context, call *atomicphase.ForeignCall, _ *struct{}) error {
			return call.Do(ctx, func(context.Context, string) error { calls.Add(1); return nil })
		}, nil),
		atomicphase.Local("slow", func(ctx context.Context, tx atomicphase.Tx, _ *struct{}) (atomicphase.Outcome, error) {
			if err := waitLeaseEnded(ctx, tx, "u", "k"); err != nil {
				return atomicphase.Outcome{}, err
			}
			return atomicphase.Respond(201, []byte("done")), nil
		}),
	}, nil)
	resp, err := r.Run(b.ctx, wf, atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/busy"})
	require.NoError(t, err, "nobody wanted the key: the unit's work commits")
	require.Equal(t, "done", string(resp.Body))
	require.EqualValues(t, 1, calls.Load(), "the call was sent once")
	info, err := r.Inspect(b.ctx, "u", "k")
	require.NoError(t, err)
	require.Equal(t, atomicphase.KeyFinished, info.Status)
	require.Equal(t, 1, info.Attempts)
}

// A lost answer to the statement that marks a call (nothing was sent: the
// bank got no call) does not hold the key for the lease plus the call
// grace: the attempt ends the mark by its token as soon as a connection
// allows, and the next retry reconciles and pays at once, once. Before, the
// key was held for LockTimeout + CallGrace while every retry was told to
// come back in a second, and inspect called it abandoned.
func TestLostCallMarkAnswerDoesNotHoldTheKey(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	bk := newBank()
	wf := payoutWorkflow(bk)
	var armed atomic.Bool
	pool := answerLosingPool(t, b, &armed, 0)
	var lost atomic.Bool
	r, err := atomicphase.NewRunner(pool, &atomicphase.Config{CallGrace: time.Minute,
		FaultInjector: atomicphase.FaultInjectorFunc(func(_ context.Context, at atomicphase.FaultPoint, _ *pgx.Conn) error {
			if at.Phase == "pay" && at.Place == atomicphase.BeforePhase && lost.CompareAndSwap(false, true) {
				armed.Store(true) // the next statement is the call's mark: lose its answer
			}
			return nil
		})})
	require.NoError(t, err)
	_, err = r.Run(b.ctx, wf, payoutRequest("k"))
	require.Error(t, err)
	require.True(t, atomicphase.Retryable(err))
	require.Zero(t, bk.calls.Load(), "nothing was sent")

	info, err := r.Inspect(b.ctx, "driver_1", "k")
	require.NoError(t, err)
	require.NotEqual(t, atomicphase.KeyInProgress, info.Status, "the hold ended with the attempt")
	resp, err := r.Run(b.ctx, wf, payoutRequest("k"))
	require.NoError(t, err, "the retry is not held off")
	require.Equal(t, 201, resp.Status)
	require.EqualValues(t, 1, bk.calls.Load(), "paid once")
}
