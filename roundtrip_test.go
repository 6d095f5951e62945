package atomicphase_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
)

// TestRoundTripBudget pins the cost of the hot paths: acquisition and replay
// are one round trip each; a phase costs its own statements (BEGIN rides
// along with the first) plus one for its recovery point and COMMIT.
func TestRoundTripBudget(t *testing.T) {
	t.Parallel()
	counter := &atomicphasetest.RoundTrips{}
	opts := *testDBOpts
	opts.PoolConfig = func(cfg *pgxpool.Config) {
		cfg.MaxConns = 1 // one connection, so statements stay prepared
		cfg.ConnConfig.Tracer = counter
	}
	db := atomicphasetest.NewDB(t, &opts)
	runner, err := atomicphase.NewRunner(db.Pool, nil)
	require.NoError(t, err)
	var c counters
	wf := orderWorkflow(t, &c, hooks{})
	ctx := context.Background()

	_, err = runner.Run(ctx, wf, orderRequest("u", "warm-up"))
	require.NoError(t, err)

	counter.Reset()
	_, err = runner.Run(ctx, wf, orderRequest("u", "measured"))
	require.NoError(t, err)
	// acquire 1 · create: INSERT(+BEGIN) 1, checkpoint+COMMIT 1 ·
	// charge: checkpoint 1 · finish: INSERT(+BEGIN) 1, checkpoint+COMMIT 1
	require.Equal(t, int64(6), counter.Count(), "round trips for a new key through create → charge → finish")

	counter.Reset()
	resp, err := runner.Run(ctx, wf, orderRequest("u", "measured"))
	require.NoError(t, err)
	require.True(t, resp.Replayed)
	require.Equal(t, int64(1), counter.Count(), "a replay is one round trip")

	counter.Reset()
	_, err = runner.Run(ctx, wf, atomicphase.Request{Scope: "u", Key: "measured", Method: "POST", Path: "/other"})
	require.ErrorIs(t, err, atomicphase.ErrFingerprintMismatch)
	require.Equal(t, int64(1), counter.Count(), "a mismatch is one round trip")
}

// TestReplayWritesNothing checks that replays leave the key row's tuple
// alone: same xmin, same ctid, so no new row version, no dead tuple.
func TestReplayWritesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var c counters
	wf := orderWorkflow(t, &c, hooks{})
	_, err := b.runner.Run(b.ctx, wf, orderRequest("u", "k"))
	require.NoError(t, err)

	version := func() string {
		var v string
		require.NoError(t, b.db.Pool.QueryRow(b.ctx, "SELECT xmin::text || '@' || ctid::text FROM idempotency_keys").Scan(&v))
		return v
	}
	before := version()
	for range 20 {
		resp, err := b.runner.Run(b.ctx, wf, orderRequest("u", "k"))
		require.NoError(t, err)
		require.True(t, resp.Replayed)
	}
	other := orderRequest("u", "k")
	other.Params = []byte(`{"item":"boat","quantity":1}`)
	_, err = b.runner.Run(b.ctx, wf, other)
	require.ErrorIs(t, err, atomicphase.ErrFingerprintMismatch)
	require.Equal(t, before, version(), "replays and mismatches do not rewrite the key row")
}
