package aphttp_test

import (
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"testing/iotest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase/aphttp"
)

// counting is a transport that counts the attempts handed to it, on its
// own connections.
type counting struct {
	inner http.RoundTripper
	n     atomic.Int32
}

func (c *counting) RoundTrip(req *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.inner.RoundTrip(req)
}

// countingClient is a client with a short backoff whose attempts are
// counted; timeout bounds a client that would retry forever.
func countingClient(t *testing.T, timeout time.Duration, onRetry func(int, time.Duration, error)) (*aphttp.Client, *counting) {
	t.Helper()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	ct := &counting{inner: tr}
	return aphttp.NewClient(&aphttp.ClientOptions{
		HTTPClient: &http.Client{Transport: ct},
		Timeout:    timeout, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond,
		OnRetry: onRetry,
	}), ct
}

// TestClientDoesNotRetryARequestThatCannotBeSent: a request no connection
// can carry (a header HTTP forbids, a method that is no token, a body
// shorter or longer than its ContentLength, a body that fails to read or
// cannot be had anew) is tried once and returned with ErrUnsendable: no
// retry can send it. The client's long timeout is never reached.
func TestClientDoesNotRetryARequestThatCannotBeSent(t *testing.T) {
	t.Parallel()
	gone := errors.New("the disk is gone")
	for _, tc := range []struct {
		name      string
		edit      func(*http.Request)
		attempts  int32  // handed to the transport
		says      string // in the error
		wrapped   error  // wrapped by the error, if any
		serverMay bool   // the server may see the request's head
		// answerMay: the server may answer the part it was sent before the
		// transport finds the body longer than its length; then that
		// answer is the result, after one attempt, never retried.
		answerMay bool
	}{
		{name: "header value", attempts: 1, says: "X-Note",
			edit: func(r *http.Request) { r.Header.Set("X-Note", "one\r\nX-Injected: two") }},
		{name: "header name", attempts: 1, says: "X Note",
			edit: func(r *http.Request) { r.Header["X Note"] = []string{"one"} }},
		{name: "trailer", attempts: 1, says: "X-Sum",
			edit: func(r *http.Request) { r.Trailer = http.Header{"X-Sum": {"a\x00b"}} }},
		{name: "method", attempts: 1, says: "method",
			edit: func(r *http.Request) { r.Method = "POST /x" }},
		{name: "port", attempts: 1, says: "port",
			edit: func(r *http.Request) { r.URL.Host = "127.0.0.1:99999" }},
		{name: "body shorter than its length", attempts: 1, says: "ContentLength", serverMay: true,
			edit: func(r *http.Request) { r.ContentLength = 100 }},
		{name: "body longer than its length", attempts: 1, says: "ContentLength", serverMay: true, answerMay: true,
			edit: func(r *http.Request) { r.ContentLength = 2 }},
		{name: "long body shorter than its length", attempts: 1, says: "ContentLength", serverMay: true,
			edit: func(r *http.Request) {
				body := strings.Repeat("x", 1<<20)
				r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(body)), nil }
				r.ContentLength = 1<<20 + 1
			}},
		{name: "body that fails to read", attempts: 1, says: "reading the request body", wrapped: gone, serverMay: true,
			edit: func(r *http.Request) {
				r.GetBody = func() (io.ReadCloser, error) {
					return io.NopCloser(io.MultiReader(strings.NewReader(`{"amount": 1`), iotest.ErrReader(gone))), nil
				}
				r.ContentLength = 0 // unknown: sent chunked
			}},
		{name: "body that cannot be had anew", attempts: 0, says: "GetBody", wrapped: gone,
			edit: func(r *http.Request) {
				r.GetBody = func() (io.ReadCloser, error) { return nil, gone }
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newScripted(t, created)
			retried := 0
			c, ct := countingClient(t, time.Minute, func(int, time.Duration, error) { retried++ })
			req := postTo(t, s.srv.URL, "", `{"amount": 100}`)
			tc.edit(req)
			resp, err := c.Do(req)
			if tc.answerMay && err == nil {
				require.Equal(t, 1, resp.Attempts)
				require.NoError(t, resp.Body.Close())
				require.Zero(t, retried, "not retried")
				require.Equal(t, 1, s.requests())
				return
			}
			require.Nil(t, resp)
			require.ErrorIs(t, err, aphttp.ErrUnsendable)
			require.NotErrorIs(t, err, aphttp.ErrGaveUp)
			require.ErrorContains(t, err, tc.says)
			if tc.wrapped != nil {
				require.ErrorIs(t, err, tc.wrapped)
			}
			require.Equal(t, tc.attempts, ct.n.Load(), "attempts: %v", err)
			require.Zero(t, retried, "not retried")
			if !tc.serverMay {
				require.Zero(t, s.requests(), "nothing reached the server")
			}
			require.LessOrEqual(t, s.requests(), 1)
		})
	}
}

// resetConn closes an answer's connection with a reset (RST), without an
// answer.
func resetConn(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err == nil {
		if tcp, ok := conn.(*net.TCPConn); ok {
			_ = tcp.SetLinger(0)
		}
		_ = conn.Close()
	}
}

// TestClientRetriesConnectionsThatFail: a connection refused, closed or
// reset before the answer, even while the body is being sent, is retried
// with the same request, which then gets its answer. (The request-side
// checks of TestClientDoesNotRetryARequestThatCannotBeSent never take
// these for a request that cannot be sent.)
func TestClientRetriesConnectionsThatFail(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("x", 8<<20) // more than the connection's buffers hold
	for _, tc := range []struct {
		name, body string
		first      func(w http.ResponseWriter)
	}{
		{"closed before the answer", `{}`, hangUp},
		{"reset before the answer", `{}`, resetConn},
		{"closed while the body is sent", big, hangUp},
		{"reset while the body is sent", big, resetConn},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var bodies atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if bodies.Add(1) == 1 {
					tc.first(w) // the body mostly unread
					return
				}
				body, err := io.ReadAll(r.Body)
				if err != nil || string(body) != tc.body {
					w.WriteHeader(http.StatusBadRequest)
					return
				}
				created(w)
			}))
			t.Cleanup(srv.Close)
			var causes []error
			c, ct := countingClient(t, time.Minute, func(_ int, _ time.Duration, cause error) { causes = append(causes, cause) })
			resp, err := c.Do(postTo(t, srv.URL, "", tc.body))
			require.NoError(t, err)
			defer resp.Body.Close()
			require.Equal(t, http.StatusCreated, resp.StatusCode, "the whole body came on the retry")
			require.Equal(t, 2, resp.Attempts)
			require.EqualValues(t, 2, ct.n.Load())
			require.Len(t, causes, 1)
			require.NotErrorIs(t, causes[0], aphttp.ErrUnsendable)
		})
	}

	t.Run("refused", func(t *testing.T) {
		t.Parallel()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr := ln.Addr().String()
		require.NoError(t, ln.Close()) // nothing listens there: refused
		var causes []error
		c, ct := countingClient(t, time.Minute, func(_ int, _ time.Duration, cause error) {
			causes = append(causes, cause)
			if len(causes) == 1 { // the server comes up before the retry
				ln, err := net.Listen("tcp", addr)
				require.NoError(t, err)
				srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { created(w) }))
				srv.Listener = ln
				srv.Start()
				t.Cleanup(srv.Close)
			}
		})
		resp, err := c.Do(postTo(t, "http://"+addr, "", `{}`))
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusCreated, resp.StatusCode)
		require.EqualValues(t, 2, ct.n.Load())
		require.Len(t, causes, 1)
		var op *net.OpError
		require.ErrorAs(t, causes[0], &op, "a refused connection: %v", causes[0])
	})
}

// TestClientDoesNotRetryARedirectItsPolicyRefused: a redirect the
// HTTPClient's CheckRedirect refuses is final, whatever its error says.
func TestClientDoesNotRetryARedirectItsPolicyRefused(t *testing.T) {
	t.Parallel()
	s := newScripted(t, func(w http.ResponseWriter) {
		w.Header().Set("Location", "/elsewhere")
		w.WriteHeader(http.StatusTemporaryRedirect)
	})
	refused := errors.New("no redirects to elsewhere")
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	ct := &counting{inner: tr}
	c := aphttp.NewClient(&aphttp.ClientOptions{
		HTTPClient: &http.Client{Transport: ct, CheckRedirect: func(*http.Request, []*http.Request) error { return refused }},
		Timeout:    time.Minute, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond,
	})
	_, err := c.Do(postTo(t, s.srv.URL, "", `{}`))
	require.ErrorIs(t, err, refused)
	require.NotErrorIs(t, err, aphttp.ErrGaveUp)
	require.EqualValues(t, 1, ct.n.Load())
	require.Equal(t, 1, s.requests())
}
