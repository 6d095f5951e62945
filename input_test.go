package atomicphase_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/atomicphase/atomicphase"
	"github.com/stretchr/testify/require"
)

// What the client sends is input; what phases compute is state. A body
// that names a computed field cannot set it.
func TestRequestBodyCannotSetComputedState(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var charges atomic.Int32
	resp, err := b.runner.Run(b.ctx, shopWorkflow(&charges), atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/buy",
		Params: []byte(`{"item":"rocket","quantity":1,"declined":"ha","charge_id":"ch_forged"}`)})
	require.NoError(t, err)
	require.Equal(t, 201, resp.Status, "the body's declined member reached the state")
	require.Equal(t, "ch_1", string(resp.Body))
	require.EqualValues(t, 1, charges.Load())
}

// Member names match field names exactly: the fingerprint tells "Quantity"
// and "quantity" apart, so the decoded input must too.
func TestInputMemberNamesAreCaseSensitive(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var charges atomic.Int32
	_, err := b.runner.Run(b.ctx, shopWorkflow(&charges), atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/buy",
		Params: []byte(`{"item":"rocket","Quantity":2}`)})
	require.ErrorIs(t, err, atomicphase.ErrInvalidRequest)
	require.Contains(t, err.Error(), "case-sensitive")
	require.Zero(t, b.count(t, `SELECT count(*) FROM idempotency_keys`))
}

// encoding/json folds names with Unicode (U+017F, the long s, folds to s);
// so does the check that member names match fields exactly.
func TestInputNamesFoldLikeEncodingJSON(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	type in struct {
		Sku string `json:"sku"`
	}
	type st struct{ Sku string }
	var seenSku string
	wf := atomicphase.MustWorkflow("sku", func(i in, _ *atomicphase.Request) (st, error) {
		seenSku = i.Sku
		return st{Sku: i.Sku}, nil
	}, []atomicphase.Phase[st]{
		atomicphase.Local("only", func(context.Context, atomicphase.Tx, *st) (atomicphase.Outcome, error) {
			return atomicphase.Respond(200, nil), nil
		}),
	}, nil)
	_, err := b.runner.Run(b.ctx, wf, atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/s",
		Params: []byte(`{"sku":"cheap","\u017fku":"expensive"}`)})
	require.ErrorIs(t, err, atomicphase.ErrInvalidRequest, "decoded sku=%q from a member that is not named sku", seenSku)
}
