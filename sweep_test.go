package atomicphase_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

// crashOnce is a fault injector that kills the first attempt at place of
// phase, as a SIGKILL would: no commit, no rollback, no unlock.
func crashOnce(phase string, place atomicphase.FaultPlace) atomicphase.FaultInjector {
	var fired atomic.Bool
	return atomicphase.FaultInjectorFunc(func(_ context.Context, at atomicphase.FaultPoint, _ *pgx.Conn) error {
		if at.Phase == phase && at.Place == place && fired.CompareAndSwap(false, true) {
			return fmt.Errorf("killed: %w", atomicphase.ErrCrashed)
		}
		return nil
	})
}

// ageLocks makes every held lock older than the lock timeout, and every
// foreign call's quiet period past: the passage of time after a crash,
// without the wait. It marks each unfinished key due, as the sweep's
// watermark does once that much time has passed. Times are shifted in UTC, on
// timestamps without time zone, whose operators are immutable: Citus
// refuses a stable one (timestamptz minus interval) applied to a column in
// an UPDATE.
func ageLocks(t *testing.T, b *testBundle) {
	t.Helper()
	_, err := b.db.Pool.Exec(b.ctx, `UPDATE idempotency_keys SET locked_at = (locked_at AT TIME ZONE 'UTC' - interval '1 day') AT TIME ZONE 'UTC',
		call_until = (call_until AT TIME ZONE 'UTC' - interval '1 day') AT TIME ZONE 'UTC',
		next_attempt_at = CASE WHEN response_status IS NULL AND parked_at IS NULL
		                       THEN coalesce(next_attempt_at, created_at) ELSE next_attempt_at END
		WHERE locked_at IS NOT NULL OR call_until IS NOT NULL
		   OR (response_status IS NULL AND parked_at IS NULL AND next_attempt_at IS NULL)`)
	require.NoError(t, err)
}

func newSweeper(t *testing.T, b *testBundle, cfg *atomicphase.SweepConfig) *atomicphase.Sweeper {
	t.Helper()
	s, err := atomicphase.NewSweeper(b.runner, cfg)
	require.NoError(t, err)
	return s
}

// A request whose process died after its foreign call, and whose client
// never came back, is finished by the sweep: one downstream effect, the
// response stored, and the client's late retry replays it.
func TestSweepCompletesAKeyItsClientGaveUpOn(t *testing.T) {
	t.Parallel()
	b := setup(t, &atomicphase.Config{FaultInjector: crashOnce("charge", atomicphase.AfterForeign)})
	var c counters
	wf := orderWorkflow(t, &c, hooks{})
	_, err := b.runner.Run(b.ctx, wf, orderRequest("u", "k"))
	require.ErrorIs(t, err, atomicphase.ErrCrashed)
	require.EqualValues(t, 1, c.charge.Load())

	s := newSweeper(t, b, nil)
	res, err := s.RunOnce(b.ctx)
	require.NoError(t, err)
	require.Zero(t, res.Examined, "a live-looking lock is left to its holder")

	ageLocks(t, b)
	res, err = s.RunOnce(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 1, res.Examined)
	require.Equal(t, 1, res.Completed)
	require.EqualValues(t, 2, c.charge.Load(), "the call is repeated once, with the same downstream key")
	require.EqualValues(t, 1, c.create.Load(), "the committed phase is not run again")
	info, err := b.runner.Inspect(b.ctx, "u", "k")
	require.NoError(t, err)
	require.Equal(t, atomicphase.KeyFinished, info.Status)
	require.Equal(t, 2, info.Attempts)

	resp, err := b.runner.Run(b.ctx, wf, orderRequest("u", "k"))
	require.NoError(t, err)
	require.True(t, resp.Replayed)
	require.Equal(t, info.Response.Body, resp.Body)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE phase = 'finish'`))
}

// Two sweeps and a client retry racing for one abandoned key: exactly one
// of them runs each remaining phase; the others skip the key.
func TestSweepsAndAClientRaceForOneKey(t *testing.T) {
	t.Parallel()
	for round := range 5 {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			t.Parallel()
			b := setup(t, &atomicphase.Config{FaultInjector: crashOnce("charge", atomicphase.AfterForeign)})
			var c counters
			wf := orderWorkflow(t, &c, hooks{})
			_, err := b.runner.Run(b.ctx, wf, orderRequest("u", "k"))
			require.ErrorIs(t, err, atomicphase.ErrCrashed)
			ageLocks(t, b)

			var wg sync.WaitGroup
			results := make([]atomicphase.SweepResult, 2)
			for i := range results {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r, err := newSweeper(t, b, nil).RunOnce(b.ctx)
					require.NoError(t, err)
					results[i] = r
				}()
			}
			var clientErr error
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, clientErr = b.runner.Run(b.ctx, wf, orderRequest("u", "k"))
			}()
			wg.Wait()
			require.EqualValues(t, 2, c.charge.Load(), "the crashed attempt's call and one more")
			require.EqualValues(t, 1, c.finish.Load(), "one of the three ran the last phase")
			completed := results[0].Completed + results[1].Completed
			if clientErr == nil {
				require.LessOrEqual(t, completed, 1)
			} else {
				require.ErrorIs(t, clientErr, atomicphase.ErrInProgress)
				require.Equal(t, 1, completed)
			}
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects WHERE phase = 'finish'`))
		})
	}
}

// A key whose phase always fails rests between the sweep's tries, longer
// each time, and is parked after MaxAttempts; the sweep then leaves it
// alone until an operator unparks it.
func TestSweepBacksOffAndParksAKeyThatKeepsFailing(t *testing.T) {
	t.Parallel()
	b := setup(t, &atomicphase.Config{MaxAttempts: 4, AttemptBackoff: 40 * time.Millisecond})
	var calls atomic.Int32
	wf := atomicphase.MustWorkflow("flaky", startEmpty[struct{}], []atomicphase.Phase[struct{}]{
		atomicphase.Local("fail", func(context.Context, atomicphase.Tx, *struct{}) (atomicphase.Outcome, error) {
			calls.Add(1)
			return atomicphase.Outcome{}, errors.New("the downstream is down")
		}),
	}, nil)
	_, err := b.runner.Run(b.ctx, wf, atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/"})
	require.Error(t, err)
	info, err := b.runner.Inspect(b.ctx, "u", "k")
	require.NoError(t, err)
	require.Equal(t, atomicphase.KeyAbandoned, info.Status)
	require.Equal(t, 1, info.Attempts)
	require.Contains(t, *info.LastError, "the downstream is down")
	require.NotNil(t, info.NextAttemptAt, "the failure set when the sweep may try again")

	// Sweep as fast as possible for a while: without backoff that would be
	// hundreds of tries; with it (20–40, 40–80, 80–160 ms) a handful.
	// (At least twenty sweeps, however long they take: on Citus each reads
	// every shard.)
	s := newSweeper(t, b, nil)
	sweeps := 0
	for deadline := time.Now().Add(600 * time.Millisecond); time.Now().Before(deadline) || sweeps <= 20; sweeps++ {
		_, err := s.RunOnce(b.ctx)
		require.NoError(t, err)
	}
	require.Greater(t, sweeps, 20, "the loop swept often")
	info, err = b.runner.Inspect(b.ctx, "u", "k")
	require.NoError(t, err)
	require.Equal(t, atomicphase.KeyParked, info.Status, "parked after attempt %d", info.Attempts)
	require.Equal(t, 4, info.Attempts)
	require.EqualValues(t, 4, calls.Load())
	require.Contains(t, *info.LastError, "attempt 4 of 4")

	for range 5 {
		res, err := s.RunOnce(b.ctx)
		require.NoError(t, err)
		require.Zero(t, res.Examined, "a parked key is left to an operator")
	}
	parked, err := b.runner.ListKeys(b.ctx, &atomicphase.KeyFilter{Status: atomicphase.KeyParked})
	require.NoError(t, err)
	require.Len(t, parked, 1)
	require.Equal(t, "k", parked[0].Key)

	require.NoError(t, b.runner.Unpark(b.ctx, "u", "k"))
	res, err := s.RunOnce(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 1, res.Examined, "unparked, the key is tried again")
	require.EqualValues(t, 5, calls.Load())
}

// The reaper deletes finished keys past their retention, in batches, and
// nothing else: no unfinished, parked or recent key, none of the keys being
// served meanwhile. The same client key is afterwards a new request, with a
// new downstream key.
func TestSweepReapsOnlyOldFinishedKeys(t *testing.T) {
	t.Parallel()
	var batches []int
	var mu sync.Mutex
	obs := atomicphase.ObserverFunc(func(_ context.Context, e atomicphase.Event) {
		if e.Kind == atomicphase.EventTTLPruned {
			mu.Lock()
			batches = append(batches, e.Count)
			mu.Unlock()
		}
	})
	b := setup(t, &atomicphase.Config{Observer: obs})
	var c counters
	var keys []string
	var keyMu sync.Mutex
	wf := orderWorkflow(t, &c, hooks{charge: func(ctx context.Context, call *atomicphase.ForeignCall, s *orderState) error {
		return call.Do(ctx, func(ctx context.Context, key string) error {
			keyMu.Lock()
			keys = append(keys, key)
			keyMu.Unlock()
			s.ChargeID = "ch_" + key[:8]
			return nil
		})
	}})
	for i := range 7 {
		_, err := b.runner.Run(b.ctx, wf, orderRequest("u", fmt.Sprintf("old-%d", i)))
		require.NoError(t, err)
	}
	_, err := b.db.Pool.Exec(b.ctx, `UPDATE idempotency_keys SET finished_at = (finished_at AT TIME ZONE 'UTC' - interval '2 hours') AT TIME ZONE 'UTC',
		created_at = (created_at AT TIME ZONE 'UTC' - interval '2 hours') AT TIME ZONE 'UTC'`)
	require.NoError(t, err)
	_, err = b.runner.Run(b.ctx, wf, orderRequest("u", "recent"))
	require.NoError(t, err)
	failing := atomicphase.MustWorkflow("stuck", startEmpty[struct{}], []atomicphase.Phase[struct{}]{
		atomicphase.Local("fail", func(context.Context, atomicphase.Tx, *struct{}) (atomicphase.Outcome, error) {
			return atomicphase.Outcome{}, atomicphase.Permanent(errors.New("no"))
		}),
	}, nil)
	_, err = b.runner.Run(b.ctx, failing, atomicphase.Request{Scope: "u", Key: "parked", Method: "POST", Path: "/"})
	require.ErrorIs(t, err, atomicphase.ErrPermanent)
	_, err = b.db.Pool.Exec(b.ctx, `UPDATE idempotency_keys SET created_at = (created_at AT TIME ZONE 'UTC' - interval '2 hours') AT TIME ZONE 'UTC',
		updated_at = (updated_at AT TIME ZONE 'UTC' - interval '2 hours') AT TIME ZONE 'UTC'`)
	require.NoError(t, err)

	// Serve new keys while the sweep reaps.
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 10 {
			_, err := b.runner.Run(b.ctx, wf, orderRequest("u", fmt.Sprintf("live-%d", i)))
			require.NoError(t, err)
		}
	}()
	res, err := newSweeper(t, b, &atomicphase.SweepConfig{Retention: time.Hour, ReapBatchSize: 3}).RunOnce(b.ctx)
	wg.Wait()
	require.NoError(t, err)
	require.Equal(t, 7, res.Reaped)
	mu.Lock()
	require.Equal(t, []int{3, 3, 1}, batches, "batches of at most ReapBatchSize")
	mu.Unlock()
	require.Zero(t, b.count(t, `SELECT count(*) FROM idempotency_keys WHERE idempotency_key LIKE 'old-%'`))
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM idempotency_keys WHERE idempotency_key IN ('recent', 'parked')`),
		"a recently finished key and an old parked one stay")
	require.Equal(t, 10, b.count(t, `SELECT count(*) FROM idempotency_keys WHERE idempotency_key LIKE 'live-%' AND response_status = 201`))

	resp, err := b.runner.Run(b.ctx, wf, orderRequest("u", "old-0"))
	require.NoError(t, err)
	require.False(t, resp.Replayed, "a reaped key is a new request")
	keyMu.Lock()
	defer keyMu.Unlock()
	require.NotEqual(t, keys[0], keys[len(keys)-1], "with a new downstream key")
}
