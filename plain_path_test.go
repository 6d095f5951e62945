package atomicphase_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
)

// A request that succeeds first time runs no function of the library's on
// one PostgreSQL, marked as a retry or not: its key's read, its recording,
// its checkpoints and its finish are plain statements, which call a
// function only on the branch that refuses. The server counts the calls
// (track_functions), on the one connection the requests use.
func TestAFreshRequestRunsNoFunction(t *testing.T) {
	t.Parallel()
	atomicphasetest.SkipOnCitus(t, "on Citus a new key is recorded through atomicphase_record_first, on the worker that holds its shard")
	opts := *testDBOpts
	opts.PoolConfig = func(cfg *pgxpool.Config) {
		cfg.MaxConns = 1
		cfg.ConnConfig.RuntimeParams["track_functions"] = "all"
	}
	db := atomicphasetest.NewDB(t, &opts)
	ctx := context.Background()
	var version int
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&version))
	if version < 150000 {
		t.Skip("pg_stat_force_next_flush, which makes the counts readable at once, is PostgreSQL 15's")
	}
	runner, err := atomicphase.NewRunner(db.Pool, nil)
	require.NoError(t, err)
	wf := orderWorkflow(t, &counters{}, hooks{})

	// calls are the library's functions called so far, by name, as the
	// server counts them once this connection's counts are flushed.
	calls := func() map[string]int64 {
		_, err := db.Pool.Exec(ctx, "SELECT pg_stat_force_next_flush()")
		require.NoError(t, err)
		rows, err := db.Pool.Query(ctx, `SELECT funcname || '(' || funcid::regprocedure::text || ')', calls
			FROM pg_stat_user_functions WHERE funcname LIKE 'atomicphase\_%'`)
		require.NoError(t, err)
		got := map[string]int64{}
		var name string
		var n int64
		_, err = pgx.ForEachRow(rows, []any{&name, &n}, func() error { got[name] = n; return nil })
		require.NoError(t, err)
		return got
	}
	// A first request does a process's one-time work (the workflow's
	// version registered), and proves the counting counts.
	_, err = runner.Run(ctx, wf, orderRequest("u", "warm-up"))
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, "SELECT atomicphase_state_name('f')")
	require.NoError(t, err)
	before := calls()
	require.NotEmpty(t, before, "the server counts function calls on this connection")

	for _, retry := range []bool{false, true} {
		req := orderRequest("u", "fresh-"+map[bool]string{false: "unmarked", true: "marked"}[retry])
		req.Retry = retry
		resp, err := runner.Run(ctx, wf, req)
		require.NoError(t, err)
		require.Equal(t, 201, resp.Status)
		require.Equal(t, before, calls(), "retry=%v: a fresh request called a function", retry)
	}
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE status = 'f'`).Scan(&n))
	require.Equal(t, 3, n, "the requests finished")
}
