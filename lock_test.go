package atomicphase_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

func TestRunConcurrentDuplicatesRunPhasesOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var c counters
	wf := orderWorkflow(t, &c, hooks{})

	const n = 50
	var (
		wg                         sync.WaitGroup
		mu                         sync.Mutex
		fresh, replays, inProgress int
		bodies                     = map[string]bool{}
		start                      = make(chan struct{})
		unexpected                 []error
	)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			resp, err := b.runner.Run(b.ctx, wf, orderRequest("user_1", "same-key"))
			mu.Lock()
			defer mu.Unlock()
			var ip *atomicphase.InProgressError
			switch {
			case errors.As(err, &ip):
				require.Positive(t, ip.RetryAfter)
				inProgress++
			case err != nil:
				unexpected = append(unexpected, err)
			case resp.Replayed:
				replays++
				bodies[string(resp.Body)] = true
			default:
				fresh++
				bodies[string(resp.Body)] = true
			}
		}()
	}
	close(start)
	wg.Wait()
	require.Empty(t, unexpected)
	require.Equal(t, 1, fresh, "exactly one attempt runs the phases")
	require.Equal(t, n, fresh+replays+inProgress)
	require.Len(t, bodies, 1, "every answer carries the same body")
	require.Equal(t, []int32{1, 1, 1}, []int32{c.create.Load(), c.charge.Load(), c.finish.Load()})
	require.Equal(t, 2, b.count(t, "SELECT count(*) FROM effects"))
}

func TestRunDuplicateAnsweredAtOnceDuringSlowForeignCall(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	release := make(chan struct{})
	entered := make(chan struct{})
	var c counters
	wf := orderWorkflow(t, &c, hooks{charge: func(ctx context.Context, call *atomicphase.ForeignCall, s *orderState) error {
		return call.Do(ctx, func(ctx context.Context, key string) error {
			close(entered)
			<-release // a slow downstream
			s.ChargeID = "ch_slow"
			return nil
		})
	}})
	done := make(chan error, 1)
	go func() {
		_, err := b.runner.Run(b.ctx, wf, orderRequest("u", "k"))
		done <- err
	}()
	<-entered

	// The holder is inside its foreign call: it must hold no row lock, no
	// transaction and no connection, so the duplicate is answered at once.
	ctx, cancel := context.WithTimeout(b.ctx, 2*time.Second)
	defer cancel()
	_, err := b.runner.Run(ctx, wf, orderRequest("u", "k"))
	require.ErrorIs(t, err, atomicphase.ErrInProgress)
	require.Zero(t, b.count(t, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND state LIKE 'idle in transaction%'`), "no transaction is open during the foreign call")
	require.Zero(t, b.db.Pool.Stat().AcquiredConns()-0, "no pooled connection is held during the foreign call")

	close(release)
	require.NoError(t, <-done)
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

// lockKey makes (u, key) look held by an attempt that took it age ago and
// has committed nothing since, as a crashed or stalled process leaves it.
func lockKey(t *testing.T, b *testBundle, key string, age time.Duration) {
	t.Helper()
	tag, err := b.db.Pool.Exec(b.ctx, `UPDATE idempotency_keys SET locked_at = now() - $2 * interval '1 microsecond'
		WHERE scope = 'u' AND idempotency_key = $1 AND response_status IS NULL`, key, age.Microseconds())
	require.NoError(t, err)
	require.Equal(t, int64(1), tag.RowsAffected())
}

// TestStaleLockIsTakenOver checks the stale-lock rule from both sides of the
// lock timeout, through both ways of taking a key: a lock younger than
// Config.LockTimeout keeps Run and Resume out; an older one lets them in,
// with a new lock token, at the key's recovery point.
func TestStaleLockIsTakenOver(t *testing.T) {
	t.Parallel()
	const lockTimeout = time.Minute
	takers := map[string]func(b *testBundle, wf atomicphase.AnyWorkflow) (*atomicphase.Response, error){
		"Run": func(b *testBundle, wf atomicphase.AnyWorkflow) (*atomicphase.Response, error) {
			return b.runner.Run(b.ctx, wf, orderRequest("u", "k"))
		},
		"Resume": func(b *testBundle, _ atomicphase.AnyWorkflow) (*atomicphase.Response, error) {
			return b.runner.Resume(b.ctx, "u", "k")
		},
	}
	for name, take := range takers {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, &atomicphase.Config{LockTimeout: lockTimeout})
			var c counters
			fail := true
			wf := orderWorkflow(t, &c, hooks{charge: func(ctx context.Context, call *atomicphase.ForeignCall, s *orderState) error {
				if fail {
					return errors.New("down")
				}
				return call.Do(ctx, func(context.Context, string) error { s.ChargeID = "ch_t"; return nil })
			}})
			_, err := b.runner.Run(b.ctx, wf, orderRequest("u", "k"))
			require.Error(t, err)
			require.NoError(t, b.runner.Register(wf))
			fail = false
			before, err := b.runner.Inspect(b.ctx, "u", "k")
			require.NoError(t, err)

			for _, age := range []time.Duration{0, time.Second, lockTimeout - 5*time.Second} {
				lockKey(t, b, "k", age)
				_, err := take(b, wf)
				var ip *atomicphase.InProgressError
				require.ErrorAs(t, err, &ip, "a lock %s old is live", age)
				require.Positive(t, ip.LockExpiresIn)
				require.LessOrEqual(t, ip.LockExpiresIn, lockTimeout-age)
				require.Greater(t, ip.LockExpiresIn, lockTimeout-age-5*time.Second)
			}
			info, err := b.runner.Inspect(b.ctx, "u", "k")
			require.NoError(t, err)
			require.Equal(t, before.LockToken, info.LockToken, "a live lock is not taken")
			require.Equal(t, int32(1), c.charge.Load())

			lockKey(t, b, "k", lockTimeout+time.Second)
			resp, err := take(b, wf)
			require.NoError(t, err, "a lock older than the lock timeout is stale")
			require.Equal(t, 201, resp.Status)
			require.False(t, resp.Replayed)
			require.Contains(t, string(resp.Body), `"charge_id":"ch_t"`)
			require.Equal(t, []int32{1, 2, 1}, []int32{c.create.Load(), c.charge.Load(), c.finish.Load()}, "resumed after create")
			info, err = b.runner.Inspect(b.ctx, "u", "k")
			require.NoError(t, err)
			require.NotEqual(t, before.LockToken, info.LockToken, "the takeover took the key under a token of its own")
			require.Equal(t, atomicphase.RecoveryPointFinished, info.RecoveryPoint)
		})
	}
}

// TestLockExpiresIn checks what Inspect and the in-progress error say of a
// key an attempt really holds: it goes stale within (0, LockTimeout].
func TestLockExpiresIn(t *testing.T) {
	t.Parallel()
	const lockTimeout = 30 * time.Second
	b := setup(t, &atomicphase.Config{LockTimeout: lockTimeout})
	entered, release := make(chan struct{}), make(chan struct{})
	var c counters
	wf := orderWorkflow(t, &c, hooks{charge: func(ctx context.Context, call *atomicphase.ForeignCall, s *orderState) error {
		close(entered)
		<-release
		return call.Do(ctx, func(context.Context, string) error { return nil })
	}})
	done := make(chan error, 1)
	go func() {
		_, err := b.runner.Run(b.ctx, wf, orderRequest("u", "k"))
		done <- err
	}()
	<-entered

	info, err := b.runner.Inspect(b.ctx, "u", "k")
	require.NoError(t, err)
	require.True(t, info.Locked)
	require.NotNil(t, info.LockExpiresIn)
	require.Greater(t, *info.LockExpiresIn, 0.0)
	require.LessOrEqual(t, *info.LockExpiresIn, lockTimeout.Seconds())

	_, err = b.runner.Run(b.ctx, wf, orderRequest("u", "k"))
	var ip *atomicphase.InProgressError
	require.ErrorAs(t, err, &ip)
	require.Positive(t, ip.LockExpiresIn)
	require.LessOrEqual(t, ip.LockExpiresIn, lockTimeout)
	require.Equal(t, time.Second, ip.RetryAfter, "a lock with more than a second to go says retry in a second")

	close(release)
	require.NoError(t, <-done)
	info, err = b.runner.Inspect(b.ctx, "u", "k")
	require.NoError(t, err)
	require.False(t, info.Locked)
	require.Nil(t, info.LockExpiresIn, "a key nobody holds has no lock to expire")
}
