package atomicphase_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/atomicphasetest"
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

// execModeDB is a test database whose pool sends statements in pgx's exec
// mode, as behind a transaction-pooling PgBouncer.
func execModeDB(t *testing.T, cfg *atomicphase.Config) *testBundle {
	t.Helper()
	return setupDB(t, &atomicphasetest.Options{
		SetupID: testDBOpts.SetupID,
		Setup:   testDBOpts.Setup,
		PoolConfig: func(c *pgxpool.Config) {
			c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
		},
	}, cfg)
}

// A value the driver cannot encode (a Go map for a jsonb parameter under
// the exec mode) is the code's mistake, the same on every retry: the key is
// parked at once with the cause and the fix, the client gets a final 500,
// and its retries run nothing. Before, it was transient: 503 until
// MaxAttempts parked the key.
func TestDriverEncodeErrorParksWithItsFix(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var parkedWhy []string
	b := execModeDB(t, &atomicphase.Config{MaxAttempts: 25, Observer: atomicphase.ObserverFunc(func(_ context.Context, e atomicphase.Event) {
		if e.Kind == atomicphase.EventParked {
			mu.Lock()
			parkedWhy = append(parkedWhy, e.Err.Error())
			mu.Unlock()
		}
	})})
	runs := 0
	type st struct{}
	wf := atomicphase.MustWorkflow("audit", startEmpty[st], []atomicphase.Phase[st]{
		atomicphase.Local("record", func(ctx context.Context, tx atomicphase.Tx, _ *st) (atomicphase.Outcome, error) {
			runs++
			_, err := tx.Exec(ctx, `INSERT INTO effects (scope, key, phase, note) VALUES ('u', 'k', 'record', $1::jsonb::text)`,
				map[string]any{"ride": 1})
			if err != nil {
				return atomicphase.Outcome{}, fmt.Errorf("write audit record: %w", err)
			}
			return atomicphase.Respond(201, nil), nil
		}),
	}, nil)
	req := atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/a"}
	_, err := b.runner.Run(b.ctx, wf, req)
	require.ErrorIs(t, err, atomicphase.ErrPermanent)
	require.False(t, atomicphase.Retryable(err))
	isParked, why := parked(t, b, "u", "k")
	require.True(t, isParked, "parked at its first attempt")
	require.Contains(t, why, "json.RawMessage", "the key's last error says how to fix it")
	mu.Lock()
	require.Len(t, parkedWhy, 1)
	require.Contains(t, parkedWhy[0], "fix:")
	mu.Unlock()
	for range 10 {
		_, err := b.runner.Run(b.ctx, wf, asRetry(req))
		require.ErrorIs(t, err, atomicphase.ErrParked)
	}
	require.Equal(t, 1, runs)
	// Unmarked, a retry's phase starts ahead of the key's read, and its
	// first statement stops it: nothing is written either.
	_, err = b.runner.Run(b.ctx, wf, req)
	require.ErrorIs(t, err, atomicphase.ErrParked)
	require.Zero(t, b.count(t, `SELECT count(*) FROM effects`))
}

// A transient failure that never clears is retried until the key's last
// attempt parks it. Parking stops the sweep, not the client (the Rocket
// Rides contract): the sweep leaves the key alone, while each client retry
// still runs one attempt, since the downstream may be back, and answers it
// as retryable; nothing loops on its own.
func TestKeyParkedAfterItsAttemptsIsResumedByClientsOnly(t *testing.T) {
	t.Parallel()
	b := setup(t, &atomicphase.Config{MaxAttempts: 3, AttemptBackoff: time.Millisecond, MaxAttemptBackoff: time.Millisecond})
	var runs atomic.Int32
	var down atomic.Bool
	down.Store(true)
	type st struct{}
	wf := atomicphase.MustWorkflow("down", startEmpty[st], []atomicphase.Phase[st]{
		atomicphase.Local("p", func(context.Context, atomicphase.Tx, *st) (atomicphase.Outcome, error) {
			runs.Add(1)
			if down.Load() {
				return atomicphase.Outcome{}, errors.New("dependency down")
			}
			return atomicphase.Respond(200, []byte("done")), nil
		}),
	}, nil)
	req := atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/d"}
	for i := range 3 {
		r := req
		r.Retry = i > 0
		_, err := b.runner.Run(b.ctx, wf, r)
		require.True(t, atomicphase.Retryable(err), "a transient failure is retryable: %v", err)
	}
	info, err := b.runner.Inspect(b.ctx, "u", "k")
	require.NoError(t, err)
	require.Equal(t, atomicphase.KeyParked, info.Status)
	require.EqualValues(t, 3, runs.Load())

	time.Sleep(5 * time.Millisecond) // past any backoff
	sw, err := atomicphase.NewSweeper(b.runner, &atomicphase.SweepConfig{Retention: -1})
	require.NoError(t, err)
	_, err = sw.RunOnce(b.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 3, runs.Load(), "the sweep leaves a parked key alone")

	_, err = b.runner.Run(b.ctx, wf, asRetry(req))
	require.True(t, atomicphase.Retryable(err), "still down: retryable, %v", err)
	require.EqualValues(t, 4, runs.Load(), "a client retry runs one attempt")
	down.Store(false)
	resp, err := b.runner.Run(b.ctx, wf, asRetry(req))
	require.NoError(t, err)
	require.Equal(t, "done", string(resp.Body), "the downstream is back: the client's retry finishes the key")
	require.EqualValues(t, 5, runs.Load())
}

// The timeouts a phase sets on its own transaction are transient: the
// phase fails, nothing is parked, and a retry runs it again.
func TestPhaseTimeoutsAreTransient(t *testing.T) {
	t.Parallel()
	for name, sql := range map[string]string{
		"statement_timeout": `SET LOCAL statement_timeout = '20ms'; SELECT pg_sleep(5)`,
		"lock_timeout":      `SET LOCAL lock_timeout = '20ms'; LOCK TABLE effects IN ACCESS EXCLUSIVE MODE`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, nil)
			// Something else holds the table, for lock_timeout to expire on.
			holder, err := b.db.Pool.Begin(b.ctx)
			require.NoError(t, err)
			defer func() { _ = holder.Rollback(b.ctx) }()
			_, err = holder.Exec(b.ctx, `LOCK TABLE effects IN ACCESS SHARE MODE`)
			require.NoError(t, err)
			type st struct{}
			wf := atomicphase.MustWorkflow("slow", startEmpty[st], []atomicphase.Phase[st]{
				atomicphase.Local("p", func(ctx context.Context, tx atomicphase.Tx, _ *st) (atomicphase.Outcome, error) {
					for _, stmt := range strings.Split(sql, "; ") {
						if _, err := tx.Exec(ctx, stmt); err != nil {
							return atomicphase.Outcome{}, err
						}
					}
					return atomicphase.Respond(200, nil), nil
				}),
			}, nil)
			_, err = b.runner.Run(b.ctx, wf, atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/t"})
			require.Error(t, err)
			require.True(t, atomicphase.Retryable(err), "%v", err)
			isParked, _ := parked(t, b, "u", "k")
			require.False(t, isParked)
		})
	}
}
