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
)

// One tenant's abandoned keys whose downstream hangs must not hold back
// another tenant's: the sweep picks every scope's first key before any
// scope's second, at most MaxPerScope of one scope, and resumes them side
// by side, each bounded by the lock timeout.
func TestSweepIsFairAcrossScopes(t *testing.T) {
	t.Parallel()
	b := setup(t, &atomicphase.Config{LockTimeout: 200 * time.Millisecond})
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
	_, err = b.db.Pool.Exec(b.ctx, `UPDATE idempotency_keys SET next_attempt_at = now() - CASE scope WHEN 'tenant-a' THEN interval '1 hour' ELSE interval '1 minute' END`)
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
