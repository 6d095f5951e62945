package atomicphase_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
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

// A client SDK that sets a random Idempotency-Key of its own (as stripe-go
// does unless told otherwise) must not reach the downstream with it: one
// request, one downstream key, on every retry.
func TestTransportSendsTheDerivedKeyOverTheRequestsOwn(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	got := &seen{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.add(r.Header.Get("Idempotency-Key"))
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(srv.Close)
	var failRecord atomic.Bool
	failRecord.Store(true)
	type st struct{ Keys []string }
	var attempt atomic.Int32
	wf := atomicphase.MustWorkflow("sdk_key", startEmpty[st], []atomicphase.Phase[st]{
		atomicphase.Foreign("charge", func(ctx context.Context, call *atomicphase.ForeignCall, s *st) error {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, nil)
			if err != nil {
				return err
			}
			req.Header.Set("Idempotency-Key", "sdk-random-"+string(rune('a'+attempt.Add(1))))
			resp, err := (&http.Client{Transport: call.Transport(nil)}).Do(req)
			if err != nil {
				return err
			}
			return resp.Body.Close()
		}, func(ctx context.Context, tx atomicphase.Tx, s *st) (atomicphase.Outcome, error) {
			if failRecord.Swap(false) {
				return atomicphase.Outcome{}, errors.New("record step fails once")
			}
			return atomicphase.Respond(200, nil), nil
		}),
	}, nil)
	req := atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/sdk"}
	_, err := b.runner.Run(b.ctx, wf, req)
	require.Error(t, err)
	_, err = b.runner.Run(b.ctx, wf, req)
	require.NoError(t, err)
	keys := got.all()
	require.Len(t, keys, 2, "the retry repeats the call")
	require.Equal(t, keys[0], keys[1], "both calls carry the same downstream key")
	require.True(t, strings.HasPrefix(keys[0], "ap_"), "the derived key, not the SDK's: %q", keys[0])
}

// A redirect that the HTTP client follows is part of the one call, not a
// second foreign call that would strand the key.
func TestTransportFollowsRedirectsAsOneCall(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var posts, gets atomic.Int32
	var lastKey atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		lastKey.Store(r.Header.Get("Idempotency-Key"))
		if r.Method == http.MethodPost {
			posts.Add(1)
			http.Redirect(w, r, "/charges/ch_1", http.StatusSeeOther)
			return
		}
		gets.Add(1)
		_, _ = w.Write([]byte(`{"id":"ch_1"}`))
	}))
	t.Cleanup(srv.Close)
	type st struct{ Charge string }
	wf := atomicphase.MustWorkflow("redirect", startEmpty[st], []atomicphase.Phase[st]{
		atomicphase.Foreign("charge", func(ctx context.Context, call *atomicphase.ForeignCall, s *st) error {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/charges", nil)
			resp, err := (&http.Client{Transport: call.Transport(nil)}).Do(req)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			var out struct{ ID string }
			if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
				return err
			}
			s.Charge = out.ID
			return nil
		}, func(ctx context.Context, tx atomicphase.Tx, s *st) (atomicphase.Outcome, error) {
			return atomicphase.Respond(201, []byte(s.Charge)), nil
		}),
	}, nil)
	resp, err := b.runner.Run(b.ctx, wf, atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/r"})
	require.NoError(t, err)
	require.Equal(t, "ch_1", string(resp.Body))
	require.EqualValues(t, 1, posts.Load())
	require.EqualValues(t, 1, gets.Load())
	require.True(t, strings.HasPrefix(lastKey.Load().(string), "ap_"), "the follow-up carries the downstream key too")
}

// A key row deleted (reaped, or forgotten by an operator) and recorded again
// by the same client key is a new request: its foreign calls carry new
// downstream keys, so the downstream cannot replay the old row's result.
func TestNewRowUnderAnOldKeyGetsNewDownstreamKeys(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	got := &seen{}
	var failOnce atomic.Bool
	type st struct{}
	wf := atomicphase.MustWorkflow("salted", startEmpty[st], []atomicphase.Phase[st]{
		atomicphase.Foreign("charge", func(ctx context.Context, call *atomicphase.ForeignCall, s *st) error {
			got.add(call.Key())
			if failOnce.Swap(false) {
				return errors.New("transient")
			}
			return nil
		}, func(ctx context.Context, tx atomicphase.Tx, s *st) (atomicphase.Outcome, error) {
			return atomicphase.Respond(200, nil), nil
		}),
	}, nil)
	req := atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/s"}
	failOnce.Store(true)
	_, err := b.runner.Run(b.ctx, wf, req)
	require.Error(t, err)
	_, err = b.runner.Run(b.ctx, wf, req)
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(b.ctx, `DELETE FROM idempotency_keys`)
	require.NoError(t, err)
	resp, err := b.runner.Run(b.ctx, wf, req)
	require.NoError(t, err)
	require.False(t, resp.Replayed)
	keys := got.all()
	require.Len(t, keys, 3)
	require.Equal(t, keys[0], keys[1], "retries of one row share the downstream key")
	require.NotEqual(t, keys[1], keys[2], "a new row under the same client key gets a new one")
}

// Renaming a foreign phase keeps its downstream key: a call interrupted
// before its commit and repeated after the rename is deduplicated.
func TestRenamedForeignPhaseKeepsItsDownstreamKey(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	got := &seen{}
	type st struct{}
	charge := func(ctx context.Context, call *atomicphase.ForeignCall, s *st) error {
		return call.Do(ctx, func(_ context.Context, key string) error { got.add(key); return nil })
	}
	var crash atomic.Bool
	crash.Store(true)
	record := func(ctx context.Context, tx atomicphase.Tx, s *st) (atomicphase.Outcome, error) {
		if crash.Swap(false) {
			return atomicphase.Outcome{}, errors.New("process dies after the charge, before the commit")
		}
		return atomicphase.Respond(201, nil), nil
	}
	v1 := atomicphase.MustWorkflow("pay", startEmpty[st], []atomicphase.Phase[st]{
		atomicphase.Foreign("charge", charge, record),
	}, nil)
	req := atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/pay"}
	_, err := b.runner.Run(b.ctx, v1, req)
	require.Error(t, err)

	// Next deployment renames the phase, declaring the former name as documented.
	v2 := atomicphase.MustWorkflow("pay", startEmpty[st], []atomicphase.Phase[st]{
		atomicphase.Foreign("create_charge", charge, record).WithFormerNames("charge"),
	}, nil)
	r2, err := atomicphase.NewRunner(b.db.Pool, nil)
	require.NoError(t, err)
	_, err = r2.Run(b.ctx, v2, req)
	require.NoError(t, err)
	keys := got.all()
	require.Len(t, keys, 2)
	require.Equal(t, keys[0], keys[1], "the retry of the interrupted charge reached the downstream under a different key: a second charge")
}

// Re-sending the request a redirect produced is a second call, not a
// redirect: the guard refuses it.
func TestTransportGuardCountsAResentRedirectedRequest(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var posts, gets atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/a" {
			posts.Add(1)
			http.Redirect(w, r, "/x", http.StatusSeeOther)
			return
		}
		gets.Add(1)
	}))
	t.Cleanup(srv.Close)
	type st struct{}
	var second error
	wf := atomicphase.MustWorkflow("redir2", startEmpty[st], []atomicphase.Phase[st]{
		atomicphase.Foreign("call", func(ctx context.Context, call *atomicphase.ForeignCall, s *st) error {
			c := &http.Client{Transport: call.Transport(nil)}
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/a", http.NoBody)
			resp, err := c.Do(req)
			if err != nil {
				return err
			}
			resp.Body.Close()
			// e.g. a retry helper that re-sends the last request it saw
			again := resp.Request.Clone(ctx)
			resp2, err := c.Do(again)
			second = err
			if err == nil {
				resp2.Body.Close()
			}
			return nil
		}, func(ctx context.Context, tx atomicphase.Tx, s *st) (atomicphase.Outcome, error) {
			return atomicphase.Respond(200, nil), nil
		}),
	}, nil)
	_, err := b.runner.Run(b.ctx, wf, atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/r"})
	require.ErrorIs(t, second, atomicphase.ErrSecondForeignCall, "the second request went out")
	require.ErrorIs(t, err, atomicphase.ErrPermanent)
	require.EqualValues(t, 1, posts.Load())
	require.EqualValues(t, 1, gets.Load())
}

// A foreign phase whose downstream refused and created nothing may end the
// attempt with its own failure answer, retryably: nothing stored, the key
// neither finished nor parked, and the retry calls again.
func TestAnswerFailsRetryablyWithTheWorkflowsAnswer(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var calls atomic.Int32
	type st struct{ ID string }
	wf := atomicphase.MustWorkflow("hold", startEmpty[st], []atomicphase.Phase[st]{
		atomicphase.Foreign("reserve", func(ctx context.Context, call *atomicphase.ForeignCall, s *st) error {
			return call.Do(ctx, func(context.Context, string) error {
				if calls.Add(1) == 1 {
					return atomicphase.Answer(409, []byte(`{"error":"seat held by another rider; nothing reserved"}`),
						errors.New("downstream: 409 seat held"))
				}
				s.ID = "r_1"
				return nil
			})
		}, func(context.Context, atomicphase.Tx, *st) (atomicphase.Outcome, error) {
			return atomicphase.Respond(201, []byte("reserved")), nil
		}),
	}, nil)
	req := atomicphase.Request{Scope: "u", Key: "k", Method: "POST", Path: "/hold"}
	_, err := b.runner.Run(b.ctx, wf, req)
	var answer *atomicphase.AnswerError
	require.ErrorAs(t, err, &answer)
	require.Equal(t, 409, answer.Response.Status)
	require.JSONEq(t, `{"error":"seat held by another rider; nothing reserved"}`, string(answer.Response.Body))
	require.True(t, atomicphase.Retryable(err))
	info, err := b.runner.Inspect(b.ctx, "u", "k")
	require.NoError(t, err)
	require.Equal(t, atomicphase.KeyAbandoned, info.Status, "not finished, not parked")
	resp, err := b.runner.Run(b.ctx, wf, req)
	require.NoError(t, err)
	require.Equal(t, 201, resp.Status)
	require.EqualValues(t, 2, calls.Load())

	require.ErrorIs(t, atomicphase.Answer(200, nil, nil), atomicphase.ErrPermanent, "a failure answer is 400-599")
}
