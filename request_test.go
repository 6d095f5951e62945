package atomicphase_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

func TestRunRejectsInvalidKeysBeforeAnyWrite(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var c counters
	wf := orderWorkflow(t, &c, hooks{})
	for _, key := range []string{"", strings.Repeat("k", 256), "tab\there", "nul\x00", "é-non-ascii", "del\x7f"} {
		_, err := b.runner.Run(b.ctx, wf, orderRequest("u", key))
		require.ErrorIs(t, err, atomicphase.ErrInvalidKey, "key %q", key)
	}
	_, err := b.runner.Run(b.ctx, wf, orderRequest("u", strings.Repeat("k", 255)))
	require.NoError(t, err, "255 characters is the limit, inclusive")
	require.Equal(t, 1, b.count(t, "SELECT count(*) FROM idempotency_keys"))
	require.Equal(t, int32(1), c.create.Load())
}

func TestRunInvalidParamsStoreNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var c counters
	wf := orderWorkflow(t, &c, hooks{})
	req := orderRequest("u", "k")
	req.Params = []byte(`{"item": `)
	_, err := b.runner.Run(b.ctx, wf, req)
	require.ErrorIs(t, err, atomicphase.ErrInvalidRequest)
	req.Params = []byte(`{"item": "rocket", "quantity": "many"}`) // Start cannot decode it
	_, err = b.runner.Run(b.ctx, wf, req)
	require.ErrorIs(t, err, atomicphase.ErrInvalidRequest)
	require.Zero(t, b.count(t, "SELECT count(*) FROM idempotency_keys"))

	_, err = b.runner.Run(b.ctx, wf, orderRequest("u", "k"))
	require.NoError(t, err, "a corrected request may use the key")
}

func TestRunRejectsRequestFieldsThatAreNotText(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var c counters
	wf := orderWorkflow(t, &c, hooks{})
	for _, tc := range []struct {
		mutate func(r *atomicphase.Request)
		want   error
	}{
		{func(r *atomicphase.Request) { r.Method = "PO\xffST" }, atomicphase.ErrInvalidRequest},
		{func(r *atomicphase.Request) { r.Path = "/orders\x00" }, atomicphase.ErrInvalidRequest},
		{func(r *atomicphase.Request) { r.Scope = "user\x00" }, atomicphase.ErrInvalidScope},
	} {
		req := orderRequest("u", "k")
		tc.mutate(&req)
		_, err := b.runner.Run(b.ctx, wf, req)
		require.ErrorIs(t, err, tc.want, "%+v", req)
	}
	require.Zero(t, b.count(t, "SELECT count(*) FROM idempotency_keys"), "nothing was stored")
	require.Zero(t, c.create.Load())
}

func TestScopeIsValidated(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	type st struct{}
	wf := atomicphase.MustWorkflow("scoped", startEmpty[st], []atomicphase.Phase[st]{
		atomicphase.Local("only", func(context.Context, atomicphase.Tx, *st) (atomicphase.Outcome, error) {
			return atomicphase.Respond(200, nil), nil
		}),
	}, nil)
	for name, scope := range map[string]string{"empty": "", "too long": strings.Repeat("s", 256), "NUL": "a\x00b"} {
		_, err := b.runner.Run(b.ctx, wf, atomicphase.Request{Scope: scope, Key: "k", Method: "POST", Path: "/s"})
		require.ErrorIs(t, err, atomicphase.ErrInvalidScope, name)
		require.NotErrorIs(t, err, atomicphase.ErrInvalidKey, "%s: the client's key is fine", name)
		require.False(t, atomicphase.Retryable(err))
	}
	require.Zero(t, b.count(t, `SELECT count(*) FROM idempotency_keys`))
}
