package atomicphase_test

import (
	"context"
	"errors"
	"fmt"
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
	_, err := b.db.Pool.Exec(b.ctx, `UPDATE idempotency_keys SET parked_at = parked_at - interval '2 hours' WHERE idempotency_key = 'old'`)
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
	_, err = b.db.Pool.Exec(b.ctx, `UPDATE idempotency_keys SET parked_at = parked_at - interval '30 days'`)
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
