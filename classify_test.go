package atomicphase_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

// unreachablePool is a pool whose every connection attempt fails: nothing
// listens on port 1.
func unreachablePool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig("postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=2")
	require.NoError(t, err)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

func TestRunStoreUnavailableRunsNothing(t *testing.T) {
	t.Parallel()
	runner, err := atomicphase.NewRunner(unreachablePool(t), nil)
	require.NoError(t, err)

	var c counters
	foreign := 0
	wf := orderWorkflow(t, &c, hooks{charge: func(ctx context.Context, call *atomicphase.ForeignCall, s *orderState) error {
		foreign++
		return nil
	}})
	_, err = runner.Run(context.Background(), wf, orderRequest("u", "k"))
	require.ErrorIs(t, err, atomicphase.ErrStoreUnavailable)
	require.Zero(t, c.create.Load()+c.charge.Load()+c.finish.Load())
	require.Zero(t, foreign)
}
