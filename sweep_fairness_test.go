package atomicphase_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
)

// One tenant's abandoned keys whose downstream hangs must not hold back
// another tenant's: the sweep picks every scope's first key before any
// scope's second, at most MaxPerScope of one scope, and resumes them side
// by side, each bounded by the lock timeout.
func TestSweepIsFairAcrossScopes(t *testing.T) {
	t.Parallel()
	lease := 200 * time.Millisecond
	if atomicphasetest.OnCitus() {
		// A statement through the coordinator of a cluster on one small
		// machine can take longer than a lease this short.
		lease = time.Second
	}
	b := setup(t, &atomicphase.Config{LockTimeout: lease})
	var down, hanging atomic.Bool
	down.Store(true)
	var calledA atomic.Int32
	type st struct{ Scope string }
	start := func(_ struct{}, req *atomicphase.Request) (st, error) { return st{Scope: req.Scope}, nil }
	wf := atomicphase.MustWorkflow("fair", start, []atomicphase.Phase[st]{
		atomicphase.Foreign("call", func(ctx context.Context, fc *atomicphase.ForeignCall, s *st) error {
			return fc.Do(ctx, func(ctx context.Context, _ string) error {
				if hanging.Load() && s.Scope == "tenant-a" {
					calledA.Add(1)
					<-ctx.Done() // a downstream that never answers
					return ctx.Err()
				}
				if down.Load() {
					return errors.New("down")
				}
				return nil
			})
		}, func(context.Context, atomicphase.Tx, *st) (atomicphase.Outcome, error) {
			return atomicphase.Respond(200, []byte("done")), nil
		}),
	}, nil)
	for i := range 8 {
		_, err := b.runner.Run(b.ctx, wf, atomicphase.Request{Scope: "tenant-a", Key: fmt.Sprint("a-", i), Method: "POST", Path: "/"})
		require.Error(t, err)
	}
	_, err := b.runner.Run(b.ctx, wf, atomicphase.Request{Scope: "tenant-b", Key: "b-0", Method: "POST", Path: "/"})
	require.Error(t, err)
	// Tenant a's keys have waited longest: an oldest-first sweep would
	// take them all before tenant b's.
	// (Two statements, without a CASE: Citus evaluates the time of an
	// UPDATE on the coordinator, and takes no stable function in a CASE.)
	_, err = b.db.Pool.Exec(b.ctx, `UPDATE idempotency_keys SET next_attempt_at = now() - interval '1 hour' WHERE scope = 'tenant-a'`)
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(b.ctx, `UPDATE idempotency_keys SET next_attempt_at = now() - interval '1 minute' WHERE scope = 'tenant-b'`)
	require.NoError(t, err)
	down.Store(false)
	hanging.Store(true)

	sw, err := atomicphase.NewSweeper(b.runner, &atomicphase.SweepConfig{BatchSize: 6, Retention: -1})
	require.NoError(t, err)
	res, err := sw.RunOnce(b.ctx)
	require.NoError(t, err)
	info, err := b.runner.Inspect(b.ctx, "tenant-b", "b-0")
	require.NoError(t, err)
	require.Equal(t, atomicphase.KeyFinished, info.Status, "tenant b's key is finished by the first sweep (result %+v)", res)
	require.LessOrEqual(t, calledA.Load(), int32(atomicphase.DefaultMaxPerScope), "at most MaxPerScope of one scope's keys per sweep")
	require.Equal(t, 1, res.Completed)
}
