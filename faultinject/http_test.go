package faultinject_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/faultinject"
)

// countingServer counts the POSTs it read and answers each 201.
func countingServer(t *testing.T) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var posts atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.Method == http.MethodPost {
			posts.Add(1)
		}
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(srv.Close)
	return srv, &posts
}

// send makes one request through client and reads its answer.
func send(client *http.Client, req *http.Request) error {
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return err
}

// DropAfterRequest breaks the connection once the server has read (and
// acted on) the request: the client gets no answer, and the server counted
// the request.
func TestDropAfterRequestLosesTheAnswer(t *testing.T) {
	t.Parallel()
	srv, posts := countingServer(t)
	h := faultinject.NewHTTP()
	client := &http.Client{Transport: h.Transport(nil)}
	post := func() *http.Request {
		req, err := http.NewRequest(http.MethodPost, srv.URL, nil)
		require.NoError(t, err)
		return req
	}
	require.NoError(t, send(client, post()))

	inj := faultinject.New(faultinject.Rule{Phase: "pay", Place: atomicphase.BeforePhase, Action: faultinject.DropAfterRequest})
	inj.HTTP = h
	require.NoError(t, inj.InjectFault(context.Background(), atomicphase.FaultPoint{Workflow: "w", Phase: "pay", Place: atomicphase.BeforePhase}, nil))
	err := send(client, post())
	require.Error(t, err, "the answer is lost")
	require.EqualValues(t, 2, posts.Load(), "the server read the request")

	require.NoError(t, send(client, post()), "one request only: the next is answered")
	require.EqualValues(t, 3, posts.Load())

	h.Disarm()
	require.ErrorContains(t, faultinject.New(faultinject.Rule{Place: atomicphase.BeforePhase, Action: faultinject.DropAfterRequest}).
		InjectFault(context.Background(), atomicphase.FaultPoint{Place: atomicphase.BeforePhase}, nil), "needs Injector.HTTP")
}

// The drop is a real boundary: net/http, meeting it on a reused connection
// with a request it takes for replayable (an Idempotency-Key header and a
// body it can rewind), sends the request again on its own: the second send
// the guard in ForeignCall.Transport exists to prevent.
func TestDropAfterRequestMakesNetHTTPResendAReplayableRequest(t *testing.T) {
	t.Parallel()
	srv, posts := countingServer(t)
	h := faultinject.NewHTTP()
	tr := h.Transport(nil)
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr}
	warm, err := http.NewRequest(http.MethodGet, srv.URL, nil)
	require.NoError(t, err)
	require.NoError(t, send(client, warm), "a first request opens the connection the next reuses")

	req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{"amount":100}`))
	require.NoError(t, err)
	req.Header.Set("Idempotency-Key", "k")
	inj := faultinject.New(faultinject.Rule{Place: atomicphase.BeforePhase, Action: faultinject.DropAfterRequest})
	inj.HTTP = h
	require.NoError(t, inj.InjectFault(context.Background(), atomicphase.FaultPoint{Place: atomicphase.BeforePhase}, nil))
	require.NoError(t, send(client, req), "net/http re-sent it and read the second answer")
	require.EqualValues(t, 2, posts.Load(), "two sends of one request")
}

// SlowCall sleeps Rule.Delay, or until the call's context ends (its lease
// lost).
func TestSlowCallSleepsUnderTheCallsContext(t *testing.T) {
	t.Parallel()
	at := atomicphase.FaultPoint{Workflow: "w", Phase: "pay", Place: atomicphase.AfterForeign}
	inj := faultinject.New(faultinject.Rule{Place: atomicphase.AfterForeign, Action: faultinject.SlowCall, Delay: 50 * time.Millisecond, Times: -1})
	start := time.Now()
	require.NoError(t, inj.InjectFault(context.Background(), at, nil))
	require.GreaterOrEqual(t, time.Since(start), 50*time.Millisecond)

	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(atomicphase.ErrLockLost)
	require.ErrorIs(t, inj.InjectFault(ctx, at, nil), context.Canceled)
}
