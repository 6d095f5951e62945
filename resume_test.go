package atomicphase_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

func TestResumeContinuesWithoutTheRequest(t *testing.T) {
	t.Parallel()
	b := setup(t, &atomicphase.Config{LockTimeout: 200 * time.Millisecond})
	var c counters
	fail := true
	wf := orderWorkflow(t, &c, hooks{charge: func(ctx context.Context, call *atomicphase.ForeignCall, s *orderState) error {
		if fail {
			return errors.New("down")
		}
		return call.Do(ctx, func(context.Context, string) error { s.ChargeID = "ch_r"; return nil })
	}})
	_, err := b.runner.Run(b.ctx, wf, orderRequest("u", "k"))
	require.Error(t, err)

	// Another process: a fresh Runner that only registered the workflow.
	other, err := atomicphase.NewRunner(b.db.Pool, nil)
	require.NoError(t, err)
	_, err = other.Resume(b.ctx, "u", "k")
	require.ErrorIs(t, err, atomicphase.ErrUnknownWorkflow)
	info, err := other.Inspect(b.ctx, "u", "k")
	require.NoError(t, err)
	require.False(t, info.Locked, "the refused resume unlocked the key again")

	require.NoError(t, other.Register(wf))
	fail = false
	resp, err := other.Resume(b.ctx, "u", "k")
	require.NoError(t, err)
	require.Equal(t, 201, resp.Status)
	require.Contains(t, string(resp.Body), `"charge_id":"ch_r"`)
	require.Equal(t, int32(1), c.create.Load())

	again, err := other.Resume(b.ctx, "u", "k")
	require.NoError(t, err)
	require.True(t, again.Replayed)
	require.Equal(t, resp.Body, again.Body)

	_, err = other.Resume(b.ctx, "u", "never-seen")
	require.ErrorIs(t, err, atomicphase.ErrKeyNotFound)
}
