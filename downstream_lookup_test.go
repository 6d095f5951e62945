package atomicphase_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

// A bank's webhook quotes only the reference the payout was sent with:
// FindDownstreamKey maps it back to the key and its phase, in the scope
// the webhook names and no other, and ResolveUnknown settles it.
func TestFindDownstreamKeyFromAWebhooksReference(t *testing.T) {
	t.Parallel()
	b := setup(t, syncBankConfig()) // the bank acts before it answers
	bk := newBank()
	wf := payoutWorkflow(bk)
	for _, key := range []string{"before", "k", "after"} {
		if key == "k" {
			bk.fail = []string{"act-then-lose"}
			_, err := b.runner.Run(b.ctx, wf, payoutRequest(key))
			require.ErrorIs(t, err, atomicphase.ErrOutcomeUnknown)
			continue
		}
		req := payoutRequest(key)
		req.Scope = "driver_2" // another tenant's keys, of the same workflow
		_, err := b.runner.Run(b.ctx, wf, req)
		require.NoError(t, err)
	}
	info, err := b.runner.Inspect(b.ctx, "driver_1", "k")
	require.NoError(t, err)
	require.Equal(t, atomicphase.KeyUnknown, info.Status)
	var refs []string
	bk.mu.Lock()
	for r := range bk.payouts {
		refs = append(refs, r)
	}
	bk.mu.Unlock()
	require.Len(t, refs, 3, "one payout per key")

	var found *atomicphase.DownstreamMatch
	var ref string
	for _, r := range refs {
		m, err := b.runner.FindDownstreamKey(b.ctx, "driver_1", r)
		if err == nil {
			require.Nil(t, found, "one reference is driver_1's")
			found, ref = m, r
			continue
		}
		require.ErrorIs(t, err, atomicphase.ErrDownstreamKeyNotFound, "driver_2's references are not found in driver_1")
	}
	require.NotNil(t, found)
	require.Equal(t, "k", found.Key.Key)
	require.Equal(t, "driver_1", found.Key.Scope)
	require.Equal(t, "pay", found.Phase)

	_, err = b.runner.FindDownstreamKey(b.ctx, "driver_3", ref)
	require.ErrorIs(t, err, atomicphase.ErrDownstreamKeyNotFound, "another scope cannot find driver_1's key")
	_, err = b.runner.FindDownstreamKey(b.ctx, "driver_1", "")
	require.ErrorContains(t, err, "needs the scope and the downstream key")

	m, err := atomicphase.NewRunner(b.db.Pool, nil)
	require.NoError(t, err)
	match, err := m.FindDownstreamKeyOf(b.ctx, "driver_1", ref, "payout", "pay")
	require.NoError(t, err, "named by the workflow and phase, without the code")
	require.Equal(t, "k", match.Key.Key)
	_, err = m.FindDownstreamKeyOf(b.ctx, "driver_1", ref, "payout", "prepare")
	require.ErrorIs(t, err, atomicphase.ErrDownstreamKeyNotFound)

	// A process that does not know the workflow cannot hash its phases.
	other, err := atomicphase.NewRunner(b.db.Pool, nil)
	require.NoError(t, err)
	_, err = other.FindDownstreamKey(b.ctx, "driver_1", ref)
	require.ErrorIs(t, err, atomicphase.ErrDownstreamKeyNotFound)

	resp, err := atomicphase.ResolveUnknown(b.ctx, b.runner, wf, found.Key.Scope, found.Key.Key, func(p *payout) (bool, error) {
		p.PayoutID = "po_1"
		return true, nil
	})
	require.NoError(t, err)
	require.Equal(t, "po_1", string(resp.Body))
	require.Equal(t, int32(3), bk.calls.Load(), "no payout made again")
}
