package atomicphase_test

import (
	"context"
	"encoding/json"
	"testing"

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
