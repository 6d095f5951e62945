package atomicphase_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

type startInput struct {
	Amount int `json:"amount"`
}

// A client hears only the library's words, or the workflow's own
// InvalidInputError: an error a start function returns may name a
// database user and address, and encoding/json's name Go types.
func TestStartErrorsReachTheClientOnlyInTheirOwnWords(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var startErr error
	wf := atomicphase.MustWorkflow("start_words", func(in startInput, _ *atomicphase.Request) (struct{}, error) {
		return struct{}{}, startErr
	}, []atomicphase.Phase[struct{}]{atomicphase.Local("p", respondOK)}, nil)
	run := func(key, body string) error {
		_, err := b.runner.Run(b.ctx, wf, atomicphase.Request{Scope: "s", Key: key, Method: "POST", Path: "/", Params: []byte(body)})
		return err
	}

	err := run("k1", `{"amount": [1]}`)
	require.ErrorIs(t, err, atomicphase.ErrInvalidRequest)
	require.ErrorContains(t, err, `member "amount" is a JSON array`)
	require.NotContains(t, err.Error(), "Go ", "no Go type names")
	require.NotContains(t, err.Error(), "of type int")

	startErr = atomicphase.Invalid("amount must be positive")
	err = run("k2", `{"amount": -1}`)
	require.ErrorIs(t, err, atomicphase.ErrInvalidRequest)
	require.ErrorContains(t, err, "amount must be positive", "the workflow's own words reach the client")

	startErr = errors.New(`look up user: failed to connect to user=app database=shop host=10.0.0.7: password authentication failed`)
	err = run("k3", `{"amount": 1}`)
	require.ErrorIs(t, err, atomicphase.ErrInvalidRequest)
	require.False(t, atomicphase.Retryable(err))
	require.NotContains(t, err.Error(), "10.0.0.7")
	require.NotContains(t, err.Error(), "user=app")
	require.ErrorIs(t, err, startErr, "the cause is there for the server's log")

	startErr = fmt.Errorf("look up user: %w", context.DeadlineExceeded)
	err = run("k4", `{"amount": 1}`)
	require.True(t, atomicphase.Retryable(err), "a transient failure in the start function is retryable: %v", err)
	require.NotErrorIs(t, err, atomicphase.ErrInvalidRequest)
	startErr = fmt.Errorf("fetch the price list: %w", &url.Error{Op: "Get", URL: "htp://prices", Err: errors.New("unsupported protocol scheme \"htp\"")})
	err = run("k5", `{"amount": 1}`)
	require.False(t, atomicphase.Retryable(err), "a malformed address is no transient failure: %v", err)
	_, ierr := b.runner.Inspect(b.ctx, "s", "k4")
	require.ErrorIs(t, ierr, atomicphase.ErrKeyNotFound, "nothing is stored")
}
