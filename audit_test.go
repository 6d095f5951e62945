package atomicphase_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

// An operator's actions stay on record after the key is gone: forget
// deletes the row, not its trail.
func TestAuditTrailOutlivesTheKey(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	wf := atomicphase.MustWorkflow("audited", startEmpty[payout], []atomicphase.Phase[payout]{
		atomicphase.Local("answer", func(context.Context, atomicphase.Tx, *payout) (atomicphase.Outcome, error) {
			return atomicphase.Respond(200, []byte("ok")), nil
		}),
	}, nil)
	_, err := b.runner.Run(b.ctx, wf, payoutRequest("k"))
	require.NoError(t, err)

	require.ErrorContains(t, b.runner.RecordAudit(b.ctx, &atomicphase.AuditEntry{Scope: "driver_1", Key: "k", Action: "forget"}), "needs its Actor")
	require.ErrorContains(t, b.runner.RecordAudit(b.ctx, &atomicphase.AuditEntry{Scope: "driver_1", Key: "k", Actor: "ana", Action: "x",
		Detail: []byte("{")}), "not JSON")
	require.NoError(t, b.runner.RecordAudit(b.ctx, &atomicphase.AuditEntry{Scope: "driver_1", Key: "k", Actor: "ana", Action: "inspect",
		Note: "customer asked"}))
	require.NoError(t, b.runner.Forget(b.ctx, "driver_1", "k"))
	require.NoError(t, b.runner.RecordAudit(b.ctx, &atomicphase.AuditEntry{Scope: "driver_1", Key: "k", Actor: "ana", Action: "forget",
		Note: "stored answer came from a since-fixed bug", Detail: []byte(`{"ticket":"OPS-7"}`)}))
	_, err = b.runner.Inspect(b.ctx, "driver_1", "k")
	require.ErrorIs(t, err, atomicphase.ErrKeyNotFound)

	trail, err := b.runner.AuditTrail(b.ctx, "driver_1", "k", 0)
	require.NoError(t, err)
	require.Len(t, trail, 2)
	require.Equal(t, "forget", trail[0].Action, "newest first")
	require.Equal(t, "ana", trail[0].Actor)
	require.JSONEq(t, `{"ticket":"OPS-7"}`, string(trail[0].Detail))
	require.Equal(t, "customer asked", trail[1].Note)
	require.False(t, trail[0].At.IsZero())

	trail, err = b.runner.AuditTrail(b.ctx, "driver_2", "k", 0)
	require.NoError(t, err)
	require.Empty(t, trail, "another scope's key of the same name has its own trail")
}
