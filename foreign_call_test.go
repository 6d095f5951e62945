package atomicphase_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

func TestDownstreamKeyStableAndScoped(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var c counters
	var mu sync.Mutex
	var keys []string
	fail := true
	wf := orderWorkflow(t, &c, hooks{charge: func(ctx context.Context, call *atomicphase.ForeignCall, s *orderState) error {
		return call.Do(ctx, func(ctx context.Context, key string) error {
			mu.Lock()
			defer mu.Unlock()
			keys = append(keys, key)
			if fail && s.Item == "rocket" && len(keys) == 1 {
				return errors.New("timeout after the downstream charged")
			}
			return nil
		})
	}})
	_, err := b.runner.Run(b.ctx, wf, orderRequest("user_1", "k"))
	require.Error(t, err)
	_, err = b.runner.Run(b.ctx, wf, orderRequest("user_1", "k"))
	require.NoError(t, err)
	_, err = b.runner.Run(b.ctx, wf, orderRequest("user_2", "k"))
	require.NoError(t, err)

	require.Len(t, keys, 3)
	require.Equal(t, keys[0], keys[1], "the retry repeats the call with the same downstream key")
	require.NotEqual(t, keys[0], keys[2], "another scope gets another downstream key")
	require.True(t, strings.HasPrefix(keys[0], "ap_"), keys[0])
}

func TestSecondForeignCallFailsThePhase(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var c counters
	var calls int
	wf := orderWorkflow(t, &c, hooks{charge: func(ctx context.Context, call *atomicphase.ForeignCall, s *orderState) error {
		do := func(ctx context.Context, key string) error { calls++; return nil }
		_ = call.Do(ctx, do)
		_ = call.Do(ctx, do) // swallowed error: the phase must fail anyway
		return nil
	}})
	_, err := b.runner.Run(b.ctx, wf, orderRequest("u", "k"))
	require.ErrorIs(t, err, atomicphase.ErrSecondForeignCall)
	require.Equal(t, 1, calls, "the second call never ran")
	info, err := b.runner.Inspect(b.ctx, "u", "k")
	require.NoError(t, err)
	require.Equal(t, "create", info.RecoveryPoint)
}

// TestTransportLetsOneRequestThroughWithTheKey drives ForeignCall.Transport
// against a real HTTP server: the first request carries the downstream key
// as its Idempotency-Key (unless it has one of its own), a second is refused
// before it leaves, and the phase fails even if it ignores the refusal.
func TestTransportLetsOneRequestThroughWithTheKey(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var mu sync.Mutex
	var seen []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("Idempotency-Key"))
		mu.Unlock()
		_, _ = io.WriteString(w, "ch_http")
	}))
	t.Cleanup(srv.Close)
	received := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), seen...)
	}

	var c counters
	var secondErr error
	var ownKey string // when set, the phase sends its own Idempotency-Key
	wf := orderWorkflow(t, &c, hooks{charge: func(ctx context.Context, call *atomicphase.ForeignCall, s *orderState) error {
		client := &http.Client{Transport: call.Transport(nil)}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/charges", nil)
		if err != nil {
			return err
		}
		if ownKey != "" {
			req.Header.Set("Idempotency-Key", ownKey)
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		s.ChargeID = string(body)
		if s.Item == "twice" {
			again, err := client.Get(srv.URL + "/again")
			if err == nil {
				again.Body.Close()
			}
			secondErr = err
		}
		return nil
	}})

	resp, err := b.runner.Run(b.ctx, wf, orderRequest("u", "k"))
	require.NoError(t, err)
	require.Contains(t, string(resp.Body), `"charge_id":"ch_http"`)
	first := received()
	require.Len(t, first, 1)
	require.True(t, strings.HasPrefix(first[0], "ap_"), first[0])

	ownKey = "caller-chosen"
	_, err = b.runner.Run(b.ctx, wf, orderRequest("u", "k2"))
	require.NoError(t, err)
	require.NotEqual(t, "caller-chosen", received()[1], "a request's own Idempotency-Key is replaced by the downstream key")
	require.True(t, strings.HasPrefix(received()[1], "ap_"), received()[1])

	ownKey = ""
	twice := orderRequest("u", "k3")
	twice.Params = []byte(`{"item": "twice", "quantity": 1}`)
	_, err = b.runner.Run(b.ctx, wf, twice)
	require.ErrorIs(t, err, atomicphase.ErrSecondForeignCall, "the phase fails although it swallowed the refusal")
	require.ErrorIs(t, secondErr, atomicphase.ErrSecondForeignCall)
	require.Len(t, received(), 3, "the second request never reached the server")
	info, err := b.runner.Inspect(b.ctx, "u", "k3")
	require.NoError(t, err)
	require.Equal(t, "create", info.RecoveryPoint, "nothing of the phase was recorded")
}
