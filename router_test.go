package atomicphase_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

// routeTo is a Router that sends one scope to its pool, and every other
// scope to the Runner's.
type routeTo struct {
	scope string
	pool  *pgxpool.Pool
}

func (r routeTo) Pool(scope string) *pgxpool.Pool {
	if scope == r.scope {
		return r.pool
	}
	return nil
}

// appNames records the application_name each phase ran under: which pool
// its transaction came from.
type appNames struct {
	mu    sync.Mutex
	names []string
}

func (a *appNames) record(ctx context.Context, tx pgx.Tx) error {
	var name string
	if err := tx.QueryRow(ctx, `SELECT current_setting('application_name')`).Scan(&name); err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.names = append(a.names, name)
	return nil
}

func (a *appNames) take() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := a.names
	a.names = nil
	return n
}

// With Config.Router, everything about one key goes through the pool the
// Router chooses for its scope: the request's acquisition, its phases, the
// renewals and releases, a retry's and the sweep's take, and the operator
// actions on the key. The Runner's own pool serves only what reads many
// scopes (the sweep's reads), and the scopes the Router leaves to it.
func TestRouterCarriesEveryStatementOfAKey(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	pc, err := pgxpool.ParseConfig(b.db.URL)
	require.NoError(t, err)
	pc.ConnConfig.RuntimeParams["application_name"] = "routed"
	routed, err := pgxpool.NewWithConfig(b.ctx, pc)
	require.NoError(t, err)
	t.Cleanup(routed.Close)
	var crash atomic.Bool // the next attempt dies after its call
	runner, err := atomicphase.NewRunner(b.db.Pool, &atomicphase.Config{
		Router: routeTo{scope: "tenant", pool: routed},
		FaultInjector: atomicphase.FaultInjectorFunc(func(_ context.Context, at atomicphase.FaultPoint, _ *pgx.Conn) error {
			if at.Phase == "charge" && at.Place == atomicphase.AfterForeign && crash.CompareAndSwap(true, false) {
				return fmt.Errorf("killed: %w", atomicphase.ErrCrashed)
			}
			return nil
		}),
	})
	require.NoError(t, err)

	var c counters
	var apps appNames
	wf := orderWorkflow(t, &c, hooks{
		afterCreate: apps.record,
		finish:      func(ctx context.Context, tx pgx.Tx, _ *orderState) error { return apps.record(ctx, tx) },
	})
	require.NoError(t, runner.Register(wf))
	require.NoError(t, runner.RecordVersions(b.ctx)) // the versions are the Runner's pool's to record
	acquired := func() int64 { return b.db.Pool.Stat().AcquireCount() }
	before := acquired()

	// The first attempt dies after its call; the client's retry takes the
	// key and finishes it; a second retry replays; an operator inspects it.
	crash.Store(true)
	_, err = runner.Run(b.ctx, wf, orderRequest("tenant", "k1"))
	require.ErrorIs(t, err, atomicphase.ErrCrashed)
	ageLocks(t, b)
	before += acquired() - before // ageLocks is the test's, on the Runner's pool
	resp, err := runner.Run(b.ctx, wf, orderRequest("tenant", "k1"))
	require.NoError(t, err)
	require.Equal(t, 201, resp.Status)
	replay, err := runner.Run(b.ctx, wf, orderRequest("tenant", "k1"))
	require.NoError(t, err)
	require.True(t, replay.Replayed)
	info, err := runner.Inspect(b.ctx, "tenant", "k1")
	require.NoError(t, err)
	require.Equal(t, atomicphase.KeyFinished, info.Status)
	require.Equal(t, before, acquired(), "no statement about the routed key went through the Runner's pool")
	require.Equal(t, []string{"routed", "routed"}, apps.take(), "each phase ran on the routed pool")

	// The sweep reads through the Runner's pool, and takes the key it
	// finishes through the routed one.
	_, err = runner.Run(b.ctx, wf, orderRequest("tenant", "k2"))
	require.NoError(t, err)
	crash.Store(true)
	_, err = runner.Run(b.ctx, wf, orderRequest("tenant", "k3"))
	require.ErrorIs(t, err, atomicphase.ErrCrashed)
	apps.take()
	ageLocks(t, b)
	res, err := newSweeper(t, &testBundle{db: b.db, runner: runner, ctx: b.ctx}, nil).RunOnce(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 1, res.Completed)
	require.Equal(t, []string{"routed"}, apps.take(), "the sweep finished the key on the routed pool")

	// A scope the Router leaves alone goes to the Runner's pool.
	before = acquired()
	_, err = runner.Run(b.ctx, wf, orderRequest("elsewhere", "k1"))
	require.NoError(t, err)
	require.Greater(t, acquired(), before)
	require.NotContains(t, apps.take(), "routed")
}
