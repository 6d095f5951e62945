package atomicphase_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

func TestRetryable(t *testing.T) {
	t.Parallel()
	wrap := func(err error) error { return fmt.Errorf("handler: %w", err) }
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"invalid key", atomicphase.ErrInvalidKey, false},
		{"invalid key, wrapped", wrap(atomicphase.ErrInvalidKey), false},
		{"invalid request", atomicphase.ErrInvalidRequest, false},
		{"invalid request, wrapped", wrap(fmt.Errorf("%w: %w", atomicphase.ErrInvalidRequest, errors.New("bad json"))), false},
		{"fingerprint mismatch", atomicphase.ErrFingerprintMismatch, false},
		{"fingerprint mismatch, wrapped", wrap(atomicphase.ErrFingerprintMismatch), false},
		{"in progress", &atomicphase.InProgressError{RetryAfter: 1}, true},
		{"in progress, wrapped", wrap(&atomicphase.InProgressError{}), true},
		{"lock lost", atomicphase.ErrLockLost, true},
		{"lock lost in a phase", &atomicphase.PhaseError{Workflow: "w", Phase: "p", Err: atomicphase.ErrLockLost}, true},
		{"store unavailable", wrap(atomicphase.ErrStoreUnavailable), true},
		{"phase error", &atomicphase.PhaseError{Workflow: "w", Phase: "p", Err: errors.New("payment API down")}, true},
		{"context canceled", context.Canceled, true},
		{"context canceled, wrapped", wrap(context.Canceled), true},
	}
	for _, c := range cases {
		require.Equal(t, c.want, atomicphase.Retryable(c.err), "%s: %v", c.name, c.err)
	}
}

// TestRetryableClassifiesWhatRunReturns asks Retryable about the errors Run
// really returns, not hand-made ones.
func TestRetryableClassifiesWhatRunReturns(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)

	entered, release := make(chan struct{}), make(chan struct{})
	var c counters
	failCharge := true
	wf := orderWorkflow(t, &c, hooks{charge: func(ctx context.Context, call *atomicphase.ForeignCall, s *orderState) error {
		if s.Item == "slow" {
			close(entered)
			<-release
		} else if failCharge {
			return errors.New("payment API down")
		}
		return call.Do(ctx, func(context.Context, string) error { return nil })
	}})

	// A phase error: retryable, and a retry does succeed.
	_, err := b.runner.Run(b.ctx, wf, orderRequest("u", "k"))
	var pe *atomicphase.PhaseError
	require.ErrorAs(t, err, &pe)
	require.True(t, atomicphase.Retryable(err), "%v", err)
	failCharge = false
	_, err = b.runner.Run(b.ctx, wf, orderRequest("u", "k"))
	require.NoError(t, err)
	require.False(t, atomicphase.Retryable(err))

	// A mismatch: final.
	other := orderRequest("u", "k")
	other.Params = []byte(`{"item": "boat", "quantity": 1}`)
	_, err = b.runner.Run(b.ctx, wf, other)
	require.ErrorIs(t, err, atomicphase.ErrFingerprintMismatch)
	require.False(t, atomicphase.Retryable(err), "%v", err)

	// A malformed key: final.
	_, err = b.runner.Run(b.ctx, wf, orderRequest("u", "tab\there"))
	require.ErrorIs(t, err, atomicphase.ErrInvalidKey)
	require.False(t, atomicphase.Retryable(err), "%v", err)

	// Unparseable parameters: final.
	bad := orderRequest("u", "k2")
	bad.Params = []byte(`{"item": `)
	_, err = b.runner.Run(b.ctx, wf, bad)
	require.ErrorIs(t, err, atomicphase.ErrInvalidRequest)
	require.False(t, atomicphase.Retryable(err), "%v", err)

	// A key another attempt holds: retryable.
	slow := orderRequest("u", "slow")
	slow.Params = []byte(`{"item": "slow", "quantity": 1}`)
	done := make(chan error, 1)
	go func() {
		_, err := b.runner.Run(b.ctx, wf, slow)
		done <- err
	}()
	<-entered
	_, err = b.runner.Run(b.ctx, wf, slow)
	var ip *atomicphase.InProgressError
	require.ErrorAs(t, err, &ip)
	require.True(t, atomicphase.Retryable(err), "%v", err)
	close(release)
	require.NoError(t, <-done)

	// A cancelled context: retryable.
	ctx, cancel := context.WithCancel(b.ctx)
	cancel()
	_, err = b.runner.Run(ctx, wf, orderRequest("u", "k3"))
	require.ErrorIs(t, err, context.Canceled)
	require.True(t, atomicphase.Retryable(err), "%v", err)
}
