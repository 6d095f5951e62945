package atomicphase_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

// parkKeys parks keys of a one-phase workflow named workflow, each failing
// permanently with the reason whys gives it.
func parkKeys(t *testing.T, b *testBundle, workflow string, whys map[string]string) {
	t.Helper()
	type st struct {
		Why string `json:"why"`
	}
	wf := atomicphase.MustWorkflow(workflow, func(in st, _ *atomicphase.Request) (st, error) { return in, nil }, []atomicphase.Phase[st]{
		atomicphase.Local("p", func(_ context.Context, _ atomicphase.Tx, s *st) (atomicphase.Outcome, error) {
			return atomicphase.Outcome{}, atomicphase.Permanent(errors.New(s.Why))
		}),
	}, nil)
	for k, why := range whys {
		_, err := b.runner.Run(b.ctx, wf, atomicphase.Request{Scope: "u", Key: k, Method: "POST", Path: "/" + workflow,
			Params: []byte(fmt.Sprintf(`{"why": %q}`, why))})
		require.ErrorIs(t, err, atomicphase.ErrPermanent)
	}
}

func keyNames(keys []*atomicphase.KeyInfo) []string {
	var out []string
	for _, k := range keys {
		out = append(out, k.Key)
	}
	return out
}

// The sweep deletes parked keys after their own retention, and reports
// each; younger ones stay. Before, parked keys were never reaped.
func TestSweepReapsParkedKeysAfterTheirRetention(t *testing.T) {
	t.Parallel()
	var reaped []string
	b := setup(t, &atomicphase.Config{Observer: atomicphase.ObserverFunc(func(_ context.Context, e atomicphase.Event) {
		if e.Kind == atomicphase.EventParkedReaped {
			reaped = append(reaped, fmt.Sprintf("%s %s", e.Key, e.Err))
		}
	})})
	parkKeys(t, b, "w", map[string]string{"old": "bad account", "young": "bad account"})
	_, err := b.db.Pool.Exec(b.ctx, `UPDATE idempotency_keys SET parked_at = now() - interval '2 hours' WHERE idempotency_key = 'old'`)
	require.NoError(t, err)
	s := newSweeper(t, b, &atomicphase.SweepConfig{ParkedRetention: time.Hour})
	res, err := s.RunOnce(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 1, res.ReapedParked)
	require.Equal(t, []string{`old phase "p": bad account`}, reaped)
	_, err = b.runner.Inspect(b.ctx, "u", "old")
	require.ErrorIs(t, err, atomicphase.ErrKeyNotFound)
	info, err := b.runner.Inspect(b.ctx, "u", "young")
	require.NoError(t, err)
	require.Equal(t, atomicphase.KeyParked, info.Status)

	never := newSweeper(t, b, &atomicphase.SweepConfig{ParkedRetention: -1})
	_, err = b.db.Pool.Exec(b.ctx, `UPDATE idempotency_keys SET parked_at = now() - interval '30 days'`)
	require.NoError(t, err)
	res, err = never.RunOnce(b.ctx)
	require.NoError(t, err)
	require.Zero(t, res.ReapedParked, "a negative retention keeps parked keys")
}

// Operators forget or unpark parked keys in bulk by workflow, age and
// error text, after a dry run that lists them and changes nothing. Before,
// cleanup was one forget per key.
func TestBulkForgetAndUnparkByFilter(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	parkKeys(t, b, "pay", map[string]string{"p1": "card refused", "p2": "card refused", "p3": "schema drift"})
	parkKeys(t, b, "ship", map[string]string{"s1": "card refused"})

	f := &atomicphase.KeyFilter{Workflow: "pay", ErrorContains: "card refused"}
	would, err := b.runner.ForgetKeys(b.ctx, f, &atomicphase.BulkOpts{DryRun: true})
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"p1", "p2"}, keyNames(would))
	require.Equal(t, 4, b.count(t, `SELECT count(*) FROM idempotency_keys`), "a dry run changes nothing")

	gone, err := b.runner.ForgetKeys(b.ctx, f, nil)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"p1", "p2"}, keyNames(gone))
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM idempotency_keys`))

	unparked, err := b.runner.UnparkKeys(b.ctx, &atomicphase.KeyFilter{Workflow: "ship"}, nil)
	require.NoError(t, err)
	require.Equal(t, []string{"s1"}, keyNames(unparked))
	info, err := b.runner.Inspect(b.ctx, "u", "s1")
	require.NoError(t, err)
	require.Equal(t, atomicphase.KeyAbandoned, info.Status)

	old, err := b.runner.UnparkKeys(b.ctx, &atomicphase.KeyFilter{OlderThan: time.Hour}, nil)
	require.NoError(t, err)
	require.Empty(t, old, "none is an hour old")

	_, err = b.runner.UnparkKeys(b.ctx, &atomicphase.KeyFilter{Status: atomicphase.KeyFinished}, nil)
	require.Error(t, err, "only parked keys can be unparked")
	_, err = b.runner.ForgetKeys(b.ctx, &atomicphase.KeyFilter{Status: atomicphase.KeyAbandoned}, nil)
	require.Error(t, err, "abandoned keys cannot be forgotten")
}

// A permanent failure parks a key for good whatever attempt it happens on:
// one on the key's last allowed attempt is no "ran out of attempts", and
// the client's retries get ErrParked without running anything.
func TestPermanentFailureOnTheLastAttemptStaysParked(t *testing.T) {
	t.Parallel()
	b := setup(t, &atomicphase.Config{MaxAttempts: 2})
	var runs atomic.Int32
	type st struct{}
	wf := atomicphase.MustWorkflow("last_attempt", startEmpty[st], []atomicphase.Phase[st]{
		atomicphase.Local("p", func(context.Context, atomicphase.Tx, *st) (atomicphase.Outcome, error) {
			if runs.Add(1) == 1 {
				return atomicphase.Outcome{}, errors.New("dependency down") // transient
			}
			return atomicphase.Outcome{}, atomicphase.Permanent(errors.New("account closed"))
		}),
	}, nil)
	req := atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/p"}
	_, _ = b.runner.Run(b.ctx, wf, req)
	_, _ = b.runner.Run(b.ctx, wf, asRetry(req))
	for range 3 {
		_, err := b.runner.Run(b.ctx, wf, asRetry(req))
		require.ErrorIs(t, err, atomicphase.ErrParked)
	}
	require.EqualValues(t, 2, runs.Load(), "nothing ran after the permanent failure")
}

// Concurrent retries of a key whose attempt is failing permanently never
// run it again: a retry that read the key before the park is refused by
// the take, which checks the park under the row's lock.
func TestConcurrentRetriesNeverRerunAPermanentlyParkedKey(t *testing.T) {
	t.Parallel()
	b := setup(t, &atomicphase.Config{MaxUnfinishedPerScope: 100000})
	type st struct{ Key string }
	var mu sync.Mutex
	runs := map[string]int{}
	start := func(_ struct{}, req *atomicphase.Request) (st, error) { return st{Key: req.Key}, nil }
	wf := atomicphase.MustWorkflow("park_race", start, []atomicphase.Phase[st]{
		atomicphase.Local("p", func(_ context.Context, _ atomicphase.Tx, s *st) (atomicphase.Outcome, error) {
			mu.Lock()
			runs[s.Key]++
			mu.Unlock()
			time.Sleep(2 * time.Millisecond)
			return atomicphase.Outcome{}, atomicphase.Permanent(errors.New("bad account"))
		}),
	}, nil)
	for i := range 60 {
		req := atomicphase.Request{Scope: "u", Key: fmt.Sprint("k", i), Method: "POST", Path: "/p"}
		var wg sync.WaitGroup
		deadline := time.Now().Add(10 * time.Millisecond)
		for range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(deadline) {
					_, _ = b.runner.Run(b.ctx, wf, req)
				}
			}()
		}
		wg.Wait()
	}
	mu.Lock()
	defer mu.Unlock()
	for key, n := range runs {
		require.Equal(t, 1, n, "key %s ran %d times; a permanently parked key runs no more", key, n)
	}
}
