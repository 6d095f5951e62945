package atomicphase_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

// A finished key that may have paid is not forgotten by mistake: its
// client's retry would run as a new request, with new downstream keys, and
// pay again. Forget refuses it, ForgetKeys skips it, and only a forced
// forget, with who and why on the audit trail, gives it up; the retry then
// pays a second time, as the operator meant. A key of a workflow that makes
// no foreign call is forgotten as before, by a Runner that knows so.
func TestForgettingAFinishedKeyThatPaidNeedsForce(t *testing.T) {
	t.Parallel()
	b := setup(t, syncBankConfig())
	bk := newBank()
	wf := payoutWorkflow(bk)
	type st struct{}
	local := atomicphase.MustWorkflow("local", startEmpty[st], []atomicphase.Phase[st]{
		atomicphase.Local("only", func(context.Context, atomicphase.Tx, *st) (atomicphase.Outcome, error) {
			return atomicphase.Respond(200, []byte("ok")), nil
		}),
	}, nil)
	for _, key := range []string{"paid", "paid-bulk"} {
		_, err := b.runner.Run(b.ctx, wf, payoutRequest(key))
		require.NoError(t, err)
	}
	_, err := b.runner.Run(b.ctx, local, atomicphase.Request{Scope: "driver_1", Key: "local", Method: "POST", Path: "/local"})
	require.NoError(t, err)

	info, err := b.runner.Inspect(b.ctx, "driver_1", "paid")
	require.NoError(t, err)
	require.True(t, info.Paid)
	require.ErrorIs(t, b.runner.Forget(b.ctx, "driver_1", "paid"), atomicphase.ErrKeyPaid)
	_, err = b.runner.Inspect(b.ctx, "driver_1", "paid")
	require.NoError(t, err, "refused, the key stays")

	keys, err := b.runner.ForgetKeys(b.ctx, &atomicphase.KeyFilter{Status: atomicphase.KeyFinished, Workflow: "payout"}, nil)
	require.NoError(t, err)
	require.Empty(t, keys, "skipped without force")

	// A Runner that has not the workflows' code (an operator's console, the
	// CLI) cannot tell, and counts every finished key as one that may have
	// paid.
	operator, err := atomicphase.NewRunner(b.db.Pool, nil)
	require.NoError(t, err)
	localInfo, err := operator.Inspect(b.ctx, "driver_1", "local")
	require.NoError(t, err)
	require.True(t, localInfo.Paid, "unknown to this Runner: it may have paid")
	require.ErrorIs(t, operator.Forget(b.ctx, "driver_1", "local"), atomicphase.ErrKeyPaid)
	require.NoError(t, b.runner.Register(local))
	localInfo, err = b.runner.Inspect(b.ctx, "driver_1", "local")
	require.NoError(t, err)
	require.False(t, localInfo.Paid, "its workflow makes no foreign call")
	require.NoError(t, b.runner.Forget(b.ctx, "driver_1", "local"))

	require.NoError(t, b.runner.ForgetForced(b.ctx, "driver_1", "paid", "ops", "the client asked for a second payout"))
	trail, err := b.runner.AuditTrail(b.ctx, "driver_1", "paid", 0)
	require.NoError(t, err)
	require.Len(t, trail, 1)
	require.Equal(t, "the client asked for a second payout", trail[0].Note)
	require.JSONEq(t, `true`, string(jsonField(t, trail[0].Detail, "paid")))
	keys, err = b.runner.ForgetKeys(b.ctx, &atomicphase.KeyFilter{Status: atomicphase.KeyFinished, Workflow: "payout"},
		&atomicphase.BulkOpts{Force: true, Actor: "ops", Reason: "second payouts"})
	require.NoError(t, err)
	require.Len(t, keys, 1, "forced, the bulk forget forgets it")

	// The retry after a forced forget is a new request, and pays again.
	_, err = b.runner.Run(b.ctx, wf, payoutRequest("paid"))
	require.NoError(t, err)
	require.EqualValues(t, 3, bk.calls.Load(), "two keys paid once, then one again")
}

// jsonField is the raw value of field in the JSON object raw.
func jsonField(t *testing.T, raw []byte, field string) json.RawMessage {
	t.Helper()
	var m map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(raw, &m))
	return m[field]
}

// forgetRaceTracer runs hook once, before the first statement whose text
// contains match.
type forgetRaceTracer struct {
	match string
	once  sync.Once
	hook  func()
}

func (f *forgetRaceTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, f.match) {
		f.once.Do(f.hook)
	}
	return ctx
}

func (f *forgetRaceTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// A key that finishes between Forget's read of it (unfinished: it cannot
// be forgotten, and has not paid yet) and its delete is not deleted: the
// delete takes a finished key only when the read found it finished and
// unpaid.
func TestAKeyThatFinishesWhileForgetLooksIsNotForgotten(t *testing.T) {
	t.Parallel()
	b := setup(t, syncBankConfig())
	bk := newBank()
	inFinish, release := make(chan struct{}), make(chan struct{})
	type st struct{}
	wf := atomicphase.MustWorkflow("pays", startEmpty[st], []atomicphase.Phase[st]{
		atomicphase.Foreign("pay", func(ctx context.Context, call *atomicphase.ForeignCall, _ *st) error {
			_, err := bk.pay(ctx, call.Key())
			return err
		}, nil),
		atomicphase.Local("finish", func(context.Context, atomicphase.Tx, *st) (atomicphase.Outcome, error) {
			close(inFinish)
			<-release
			return atomicphase.Respond(201, nil), nil
		}),
	}, nil)
	done := make(chan error, 1)
	go func() {
		_, err := b.runner.Run(context.Background(), wf, atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/"})
		done <- err
	}()
	<-inFinish

	tracer := &forgetRaceTracer{match: "lock_token, unknown_at, call_until", hook: func() {
		close(release)
		require.NoError(t, <-done, "the request finished")
	}}
	cfg, err := pgxpool.ParseConfig(b.db.URL)
	require.NoError(t, err)
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	operator, err := atomicphase.NewRunner(pool, nil)
	require.NoError(t, err)
	require.NoError(t, operator.Register(wf))

	require.ErrorIs(t, operator.Forget(b.ctx, "u", "k"), atomicphase.ErrKeyPaid)
	info, err := b.runner.Inspect(b.ctx, "u", "k")
	require.NoError(t, err, "the key that paid is still there")
	require.Equal(t, atomicphase.KeyFinished, info.Status)
}
