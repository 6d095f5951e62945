package aphttp_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase/aphttp"
)

// scripted is a server that answers its requests from a script, one entry
// per request (the last repeated), and records what each carried.
type scripted struct {
	srv    *httptest.Server
	mu     sync.Mutex
	keys   []string
	bodies []string
	script []func(w http.ResponseWriter)
}

func newScripted(t *testing.T, script ...func(w http.ResponseWriter)) *scripted {
	t.Helper()
	s := &scripted{script: script}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		n := len(s.keys)
		s.keys = append(s.keys, r.Header.Get(aphttp.HeaderName))
		s.bodies = append(s.bodies, string(body))
		s.mu.Unlock()
		s.script[min(n, len(s.script)-1)](w)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *scripted) requests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.keys)
}

// sent returns the keys and bodies of the requests so far.
func (s *scripted) sent() (keys, bodies []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.keys...), append([]string(nil), s.bodies...)
}

func problem(status int, typ string, retryAfter int) func(w http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		aphttp.WriteProblem(w, aphttp.Problem{Type: typ, Title: "t", Status: status}, retryAfter)
	}
}

func created(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = io.WriteString(w, `{"ok":true}`)
}

// hangUp closes the connection without an answer: the request was read,
// and may have run.
func hangUp(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err == nil {
		_ = conn.Close()
	}
}

// closing makes answer close its connection: the next attempt connects
// anew. (On a kept-alive connection, net/http's Transport itself resends a
// request with an Idempotency-Key that the server closed the connection
// on before answering, and the client sees no failure.)
func closing(answer func(w http.ResponseWriter)) func(w http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		w.Header().Set("Connection", "close")
		answer(w)
	}
}

// quick is a client whose backoff is short: the tests count attempts and
// keys, not time.
func quick(opts *aphttp.ClientOptions) *aphttp.Client {
	o := aphttp.ClientOptions{MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}
	if opts != nil {
		o.Timeout, o.OnRetry = opts.Timeout, opts.OnRetry
	}
	return aphttp.NewClient(&o)
}

func postTo(t *testing.T, url, key, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	if key != "" {
		req.Header.Set(aphttp.HeaderName, key)
	}
	return req
}

// TestClientKeepsOneKeyAcrossRetries: a request without a key gets one,
// and every attempt carries it and the same body, through a lost
// connection, a 503 and a 409, to the answer.
func TestClientKeepsOneKeyAcrossRetries(t *testing.T) {
	t.Parallel()
	s := newScripted(t, hangUp, problem(503, aphttp.ProblemTransientFailure, 1), problem(409, aphttp.ProblemInProgress, 0), created)
	resp, err := quick(nil).Do(postTo(t, s.srv.URL, "", `{"amount": 100}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Equal(t, 4, resp.Attempts)
	keys, bodies := s.sent()
	require.Len(t, keys, 4)
	require.NotEmpty(t, keys[0])
	for i := range keys {
		require.Equal(t, keys[0], keys[i], "attempt %d", i+1)
		require.Equal(t, `{"amount": 100}`, bodies[i], "attempt %d", i+1)
	}
	require.Equal(t, resp.Key, keys[0])
	h := http.Header{}
	h.Set(aphttp.HeaderName, resp.Key)
	_, err = aphttp.ParseKey(h)
	require.NoError(t, err, "the generated key is one the server accepts")

	// Two requests get two keys.
	other, err := quick(nil).Do(postTo(t, s.srv.URL, "", `{"amount": 100}`))
	require.NoError(t, err)
	other.Body.Close()
	require.NotEqual(t, resp.Key, other.Key)
}

// TestClientSendsTheCallersKey: a key the caller set is the one sent,
// unchanged, on every attempt; a malformed one is refused before sending.
func TestClientSendsTheCallersKey(t *testing.T) {
	t.Parallel()
	s := newScripted(t, problem(503, aphttp.ProblemStoreUnavailable, 1), created)
	resp, err := quick(nil).Do(postTo(t, s.srv.URL, `"order-42"`, `{}`))
	require.NoError(t, err)
	resp.Body.Close()
	keys, _ := s.sent()
	require.Equal(t, []string{`"order-42"`, `"order-42"`}, keys)
	require.Equal(t, `"order-42"`, resp.Key)

	_, err = quick(nil).Do(postTo(t, s.srv.URL, `"unterminated`, `{}`))
	require.ErrorIs(t, err, aphttp.ErrInvalidKey)
	require.Equal(t, 2, s.requests(), "a malformed key is not sent")
}

// TestClientRetriesWhatTheServerSaysToRetry: 409 in-progress and
// outcome-unknown, a 409 without a problem type, 429, 502, 503, 504 and a
// lost connection are retried; the answer after them is returned.
func TestClientRetriesWhatTheServerSaysToRetry(t *testing.T) {
	t.Parallel()
	for name, first := range map[string]func(http.ResponseWriter){
		"409 in-progress":     problem(409, aphttp.ProblemInProgress, 1),
		"409 outcome-unknown": problem(409, aphttp.ProblemOutcomeUnknown, 1),
		"409 plain":           func(w http.ResponseWriter) { w.WriteHeader(409) },
		"429 too-many-keys":   problem(429, aphttp.ProblemTooManyKeys, 1),
		"502":                 func(w http.ResponseWriter) { w.WriteHeader(502) },
		"503 transient":       problem(503, aphttp.ProblemTransientFailure, 1),
		"504":                 func(w http.ResponseWriter) { w.WriteHeader(504) },
		"connection lost":     hangUp,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := newScripted(t, first, created)
			var causes []error
			c := quick(&aphttp.ClientOptions{OnRetry: func(attempt int, wait time.Duration, cause error) {
				causes = append(causes, cause)
			}})
			resp, err := c.Do(postTo(t, s.srv.URL, "", `{}`))
			require.NoError(t, err)
			resp.Body.Close()
			require.Equal(t, http.StatusCreated, resp.StatusCode)
			require.Equal(t, 2, s.requests())
			require.Len(t, causes, 1)
			var se *aphttp.StatusError
			if name != "connection lost" {
				require.ErrorAs(t, causes[0], &se)
			} else {
				require.False(t, errors.As(causes[0], &se), "a lost connection is no answer: %v", causes[0])
			}
		})
	}
}

// TestClientDoesNotRetryFinalAnswers: 500 permanent-failure and parked,
// 422 key-reused, a 409 of another problem type and any other 4xx are
// answered once, with the problem read.
func TestClientDoesNotRetryFinalAnswers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		status int
		typ    string
	}{
		{500, aphttp.ProblemPermanentFailure},
		{500, aphttp.ProblemParked},
		{500, aphttp.ProblemInvalidScope},
		{422, aphttp.ProblemKeyReused},
		{422, aphttp.ProblemInvalidRequest},
		{400, aphttp.ProblemMissingKey},
		{401, aphttp.ProblemUnauthorized},
		{413, aphttp.ProblemBodyTooLarge},
		{409, "https://example.invalid/problems/version-conflict"},
		{404, ""},
	} {
		t.Run(fmt.Sprintf("%d %s", tc.status, strings.TrimPrefix(tc.typ, aphttp.ProblemTypeBase)), func(t *testing.T) {
			t.Parallel()
			answer := problem(tc.status, tc.typ, 0)
			if tc.typ == "" {
				answer = func(w http.ResponseWriter) { w.WriteHeader(tc.status) }
			}
			s := newScripted(t, answer, created)
			resp, err := quick(nil).Do(postTo(t, s.srv.URL, "", `{}`))
			require.NoError(t, err)
			defer resp.Body.Close()
			require.Equal(t, tc.status, resp.StatusCode)
			require.Equal(t, 1, s.requests(), "not retried")
			require.Equal(t, 1, resp.Attempts)
			if tc.typ != "" {
				require.NotNil(t, resp.Problem)
				require.Equal(t, tc.typ, resp.Problem.Type)
				body, err := io.ReadAll(resp.Body)
				require.NoError(t, err)
				require.Contains(t, string(body), tc.typ, "the body is still there to read")
			}
		})
	}
}

// TestClientWaitsWhatRetryAfterAsks: the wait before a retry is at least
// the answer's Retry-After, and otherwise the jittered backoff.
func TestClientWaitsWhatRetryAfterAsks(t *testing.T) {
	t.Parallel()
	s := newScripted(t, closing(problem(409, aphttp.ProblemInProgress, 2)), hangUp, created)
	var waits []time.Duration
	c := aphttp.NewClient(&aphttp.ClientOptions{MinBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond,
		OnRetry: func(_ int, wait time.Duration, _ error) { waits = append(waits, wait) }})
	resp, err := c.Do(postTo(t, s.srv.URL, "", `{}`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Len(t, waits, 2)
	require.GreaterOrEqual(t, waits[0], 2*time.Second, "Retry-After: 2 is honoured")
	require.GreaterOrEqual(t, waits[1], 15*time.Millisecond, "the second backoff: 20ms less at most a quarter")
	require.LessOrEqual(t, waits[1], 20*time.Millisecond)
}

// TestClientGivesUpAtTheDeadline: a Retry-After beyond the caller's
// deadline is not waited for: Do stops at once with ErrGaveUp, the
// deadline and the last answer.
func TestClientGivesUpAtTheDeadline(t *testing.T) {
	t.Parallel()
	s := newScripted(t, problem(409, aphttp.ProblemOutcomeUnknown, 100))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp, err := quick(nil).Do(postTo(t, s.srv.URL, "", `{}`).WithContext(ctx))
	require.ErrorIs(t, err, aphttp.ErrGaveUp)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	var se *aphttp.StatusError
	require.ErrorAs(t, err, &se)
	require.Equal(t, 409, se.Status)
	require.Equal(t, 100*time.Second, se.RetryAfter)
	require.Equal(t, 1, s.requests(), "no second attempt: it could not start before the deadline")
	require.NotNil(t, resp)
	defer resp.Body.Close()
	require.Equal(t, aphttp.ProblemOutcomeUnknown, resp.Problem.Type)

	// Timeout bounds Do when the context has no deadline.
	c := aphttp.NewClient(&aphttp.ClientOptions{Timeout: time.Second})
	_, err = c.Do(postTo(t, s.srv.URL, "", `{}`))
	require.ErrorIs(t, err, aphttp.ErrGaveUp)
	require.Equal(t, 2, s.requests())
}

// TestClientStopsWhenTheCallerCancels: a canceled context ends Do, during
// a wait as before an attempt, without another attempt.
func TestClientStopsWhenTheCallerCancels(t *testing.T) {
	t.Parallel()
	s := newScripted(t, problem(503, aphttp.ProblemTransientFailure, 30))
	ctx, cancel := context.WithCancel(context.Background())
	c := aphttp.NewClient(&aphttp.ClientOptions{OnRetry: func(int, time.Duration, error) { cancel() }})
	_, err := c.Do(postTo(t, s.srv.URL, "", `{}`).WithContext(ctx))
	require.ErrorIs(t, err, aphttp.ErrGaveUp)
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, 1, s.requests())
}

// TestClientAgainstMiddleware: against the real middleware, a request
// whose answer was lost after its phase committed is retried with its key
// and answered from the store, marked replayed; one waiting behind an
// attempt in progress gets that attempt's answer. The phase ran once.
func TestClientAgainstMiddleware(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var lost atomic.Int32
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if lost.Add(1) == 1 {
			// The first answer is lost: the middleware ran the request to
			// its end, and the connection breaks before the answer leaves.
			rec := httptest.NewRecorder()
			b.srv.Config.Handler.ServeHTTP(rec, r)
			hangUp(w)
			return
		}
		b.srv.Config.Handler.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	req := postTo(t, front.URL+"/notes", "", `{"text": "hello"}`)
	req.Header.Set("X-User", "alice")
	resp, err := quick(nil).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.True(t, resp.Replayed, "the answer came from the store")
	require.Equal(t, 2, resp.Attempts)
	require.EqualValues(t, 1, b.runs.Load(), "the phase ran once")
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.JSONEq(t, `{"saved": "hello", "run": 1}`, string(body))

	// In progress: the phase is held until the client has been told 409.
	held := setupHeld(t)
	held.block, held.entered = make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	go func() {
		r := postTo(t, held.srv.URL+"/notes", `"in-progress"`, `{"text": "hold"}`)
		r.Header.Set("X-User", "alice")
		resp, err := http.DefaultClient.Do(r)
		if err == nil {
			resp.Body.Close()
		}
		first <- err
	}()
	<-held.entered
	var once sync.Once
	c := quick(&aphttp.ClientOptions{OnRetry: func(_ int, _ time.Duration, cause error) {
		var se *aphttp.StatusError
		if errors.As(cause, &se) && se.Status == http.StatusConflict {
			once.Do(func() { close(held.block) })
		}
	}})
	r := postTo(t, held.srv.URL+"/notes", `"in-progress"`, `{"text": "hold"}`)
	r.Header.Set("X-User", "alice")
	second, err := c.Do(r)
	require.NoError(t, err)
	defer second.Body.Close()
	require.NoError(t, <-first)
	require.Equal(t, http.StatusCreated, second.StatusCode)
	require.True(t, second.Replayed)
	require.GreaterOrEqual(t, second.Attempts, 2)
	require.EqualValues(t, 1, held.runs.Load())
}

// TestClientAnswerIsReadAfterDo: the answer's body streams after Do
// returned, under the deadline, until the caller closes it.
func TestClientAnswerIsReadAfterDo(t *testing.T) {
	t.Parallel()
	const size = 8 << 20 // more than any buffer on the way
	s := newScripted(t, func(w http.ResponseWriter) {
		w.WriteHeader(http.StatusCreated)
		http.NewResponseController(w).Flush()
		_, _ = w.Write([]byte(strings.Repeat("x", size)))
	})
	resp, err := quick(nil).Do(postTo(t, s.srv.URL, "", `{}`))
	require.NoError(t, err)
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Len(t, data, size)
	require.NoError(t, resp.Body.Close())
}
