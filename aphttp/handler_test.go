package aphttp_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/aphttp"
	"github.com/atomicphase/atomicphase/atomicphasetest"
)

func TestMain(m *testing.M) { os.Exit(atomicphasetest.Main(m)) }

type note struct {
	Text string `json:"text"`
}

type bundle struct {
	srv     *httptest.Server
	runs    atomic.Int32
	fail    atomic.Bool
	block   chan struct{}
	entered chan struct{}
	runner  *atomicphase.Runner
	// commitEach gives the save phase CommitEachPhase.
	commitEach bool
	// sent holds the keys sent before: do marks a key's second request a
	// retry, as aphttp.Client does, unless the test says otherwise.
	sent sync.Map
}

// setup serves POST /notes through the middleware; other methods reach a
// handler that answers 299 so pass-through is visible.
func setup(t *testing.T, opts *aphttp.Options) *bundle {
	t.Helper()
	db := atomicphasetest.NewDB(t, nil)
	return setupOn(t, db.Pool, opts)
}

func setupOn(t *testing.T, pool *pgxpool.Pool, opts *aphttp.Options) *bundle {
	t.Helper()
	return setupRunnerOn(t, pool, nil, opts)
}

// setupHeld is setup with the save phase committing the key's recording
// on its own, before the phase runs, so that a test holding the phase
// holds a recorded key (with phase fusion, a key recorded in the phase's
// own transaction is not there for a duplicate to find until it commits).
func setupHeld(t *testing.T) *bundle {
	t.Helper()
	db := atomicphasetest.NewDB(t, nil)
	b := &bundle{commitEach: true}
	return b.build(t, db.Pool, nil, nil)
}

// setupRunnerOn is setupOn with the Runner's Config.
func setupRunnerOn(t *testing.T, pool *pgxpool.Pool, cfg *atomicphase.Config, opts *aphttp.Options) *bundle {
	t.Helper()
	return (&bundle{}).build(t, pool, cfg, opts)
}

func (b *bundle) build(t *testing.T, pool *pgxpool.Pool, cfg *atomicphase.Config, opts *aphttp.Options) *bundle {
	t.Helper()
	runner, err := atomicphase.NewRunner(pool, cfg)
	require.NoError(t, err)
	b.runner = runner
	wf := atomicphase.MustWorkflow("note", func(in note, _ *atomicphase.Request) (note, error) {
		if in.Text == "" {
			return in, errors.New("text is required")
		}
		return in, nil
	}, []atomicphase.Phase[note]{
		atomicphase.Local("save", func(ctx context.Context, tx atomicphase.Tx, n *note) (atomicphase.Outcome, error) {
			b.runs.Add(1)
			if b.entered != nil {
				close(b.entered)
				<-b.block
			}
			if b.fail.Load() {
				return atomicphase.Outcome{}, errors.New("downstream is down")
			}
			if n.Text == "answer" {
				return atomicphase.Outcome{}, atomicphase.Answer(http.StatusConflict, []byte(`{"error":"the notebook is locked; nothing saved"}`),
					errors.New("notebook locked"))
			}
			if n.Text == "permanent" {
				return atomicphase.Outcome{}, atomicphase.Permanent(errors.New("the downstream refuses this note for good"))
			}
			body, _ := json.Marshal(map[string]any{"saved": n.Text, "run": b.runs.Load()})
			return atomicphase.Respond(201, body).WithHeader("Location", "/notes/1"), nil
		}),
	}, &atomicphase.WorkflowOpts{CommitEachPhase: b.commitEach})
	o := aphttp.Options{Scope: func(r *http.Request) (string, error) {
		switch user := r.Header.Get("X-User"); user {
		case "":
			return "", fmt.Errorf("%w: who are you?", aphttp.ErrUnauthorized)
		case "flaky":
			return "", errors.New("the user store is down")
		case "anonymous":
			return "", nil // a bug in the server's Scope function
		default:
			return user, nil
		}
	}}
	if opts != nil {
		o.PassThroughWithoutKey, o.MaxBodyBytes = opts.PassThroughWithoutKey, opts.MaxBodyBytes
	}
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(299) })
	b.srv = httptest.NewServer(aphttp.Middleware(runner, wf, &o)(next))
	t.Cleanup(b.srv.Close)
	return b
}

type reply struct {
	status int
	header http.Header
	body   []byte
}

func (b *bundle) do(t *testing.T, method, key, body string, headers ...string) reply {
	t.Helper()
	return b.doAt(t, "/notes", method, key, body, headers...)
}

// doAt is do for another path (and query string).
func (b *bundle) doAt(t *testing.T, path, method, key, body string, headers ...string) reply {
	t.Helper()
	req, err := http.NewRequest(method, b.srv.URL+path, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("X-User", "alice")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
		if _, again := b.sent.LoadOrStore(key, true); again {
			req.Header.Set(aphttp.RetryHeaderName, aphttp.RetryHeaderValue)
		}
	}
	for i := 0; i+1 < len(headers); i += 2 {
		if headers[i] == aphttp.RetryHeaderName && headers[i+1] == "" {
			req.Header.Del(aphttp.RetryHeaderName) // an unmarked retry
			continue
		}
		if headers[i] == aphttp.HeaderName {
			req.Header.Add(headers[i], headers[i+1]) // a second line: a list
		} else {
			req.Header.Set(headers[i], headers[i+1])
		}
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return reply{resp.StatusCode, resp.Header, data}
}

func requireProblem(t *testing.T, r reply, status int, problemType string) {
	t.Helper()
	require.Equal(t, status, r.status, "body: %s", r.body)
	require.Equal(t, "application/problem+json", r.header.Get("Content-Type"))
	var p aphttp.Problem
	require.NoError(t, json.Unmarshal(r.body, &p))
	require.Equal(t, problemType, p.Type)
	require.Equal(t, status, p.Status)
	require.NotEmpty(t, p.Title)
}

func TestOtherMethodsPassThroughUntouched(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	for _, m := range []string{"GET", "HEAD", "OPTIONS", "PUT", "DELETE"} {
		r := b.do(t, m, "", "")
		require.Equal(t, 299, r.status, m)
		r = b.do(t, m, `"with-key"`, `{"text":"x"}`)
		require.Equal(t, 299, r.status, "%s with a key still passes through", m)
	}
	require.Zero(t, b.runs.Load())
}

// POST and PATCH in another case are refused, not passed to the next
// handler: a router matching methods without regard to case would run it
// unguarded. Before, "post" with a key went straight through.
func TestNonCanonicalUnsafeMethodsAreRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	for _, m := range []string{"post", "Post", "pOST", "patch", "Patch"} {
		r := b.do(t, m, `"k"`, `{"text":"x"}`)
		requireProblem(t, r, http.StatusBadRequest, aphttp.ProblemMethodCase)
		require.Contains(t, string(r.body), strings.ToUpper(m))
	}
	require.Zero(t, b.runs.Load())
}

func TestMissingKey(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	requireProblem(t, b.do(t, "POST", "", `{"text":"x"}`), 400, aphttp.ProblemMissingKey)
	requireProblem(t, b.do(t, "PATCH", "", `{"text":"x"}`), 400, aphttp.ProblemMissingKey)

	pass := setup(t, &aphttp.Options{PassThroughWithoutKey: true})
	require.Equal(t, 299, pass.do(t, "POST", "", `{"text":"x"}`).status)
	require.Zero(t, b.runs.Load()+pass.runs.Load())
}

func TestMalformedKeys(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	for _, key := range []string{`""`, strings.Repeat("k", 256), `"` + strings.Repeat("k", 256) + `"`,
		`"a", "b"`, `a,b`, `"unterminated`, `"x";param=1`, `"bad\escape"`, "caf\xc3\xa9"} {
		requireProblem(t, b.do(t, "POST", key, `{"text":"x"}`), 400, aphttp.ProblemInvalidKey)
	}
	// Two header lines are a list too.
	requireProblem(t, b.do(t, "POST", "one", `{"text":"x"}`, "Idempotency-Key", "two"), 400, aphttp.ProblemInvalidKey)
	require.Zero(t, b.runs.Load())
}

// TestOverLongKeyIs400FromTheRunner: the header parser takes a key of any
// length; the Runner's Config.MaxKeyLength is the one limit, and Run's
// ErrInvalidKey is the middleware's 400.
func TestOverLongKeyIs400FromTheRunner(t *testing.T) {
	t.Parallel()
	db := atomicphasetest.NewDB(t, nil)
	b := setupOn(t, db.Pool, nil)
	for _, key := range []string{strings.Repeat("k", 256), `"` + strings.Repeat("k", 256) + `"`} {
		_, err := aphttp.ParseKey(http.Header{aphttp.HeaderName: {key}})
		require.NoError(t, err, "the parser leaves the length to the Runner")
		r := b.do(t, "POST", key, `{"text":"x"}`)
		requireProblem(t, r, 400, aphttp.ProblemInvalidKey)
		require.Contains(t, string(r.body), "the limit is 255")
	}
	require.Equal(t, 201, b.do(t, "POST", strings.Repeat("k", 255), `{"text":"x"}`).status)

	short := setupRunnerOn(t, db.Pool, &atomicphase.Config{MaxKeyLength: 8}, nil)
	requireProblem(t, short.do(t, "POST", "123456789", `{"text":"x"}`), 400, aphttp.ProblemInvalidKey)
	require.Equal(t, 201, short.do(t, "POST", "12345678", `{"text":"x"}`).status)
	require.Equal(t, int32(1), b.runs.Load(), "only the 255-character key ran")
	require.Equal(t, int32(1), short.runs.Load(), "only the 8-character key ran")
}

// TestNonPrintableKeyIs400FromTheRunner: bytes a header value may carry but
// a key may not (UTF-8, an inner tab) pass the parser and are refused by
// the Runner, with the middleware's 400 and nothing stored.
func TestNonPrintableKeyIs400FromTheRunner(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	for _, key := range []string{"caf\xc3\xa9", "tab\there"} {
		_, err := aphttp.ParseKey(http.Header{aphttp.HeaderName: {key}})
		require.NoError(t, err, "the parser leaves the characters to the Runner")
		r := b.do(t, "POST", key, `{"text":"x"}`)
		requireProblem(t, r, 400, aphttp.ProblemInvalidKey)
		require.Contains(t, string(r.body), "not printable ASCII")
	}
	require.Zero(t, b.runs.Load())
}

func TestQuotedAndBareFormsAreTheSameKey(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	first := b.do(t, "POST", `"8e03978e-40d5-43e8-bc93-6894a57f9324"`, `{"text":"hi"}`)
	require.Equal(t, 201, first.status)
	second := b.do(t, "POST", "8e03978e-40d5-43e8-bc93-6894a57f9324", `{"text":"hi"}`)
	require.Equal(t, 201, second.status)
	require.Equal(t, "true", second.header.Get("Idempotent-Replayed"))
	require.Equal(t, first.body, second.body)
}

func TestReplayIsByteIdenticalAndMarked(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	first := b.do(t, "POST", "k1", `{"text":"hello"}`)
	require.Equal(t, 201, first.status)
	require.Empty(t, first.header.Get("Idempotent-Replayed"))
	require.Equal(t, "/notes/1", first.header.Get("Location"))
	require.Equal(t, "application/json", first.header.Get("Content-Type"))

	replay := b.do(t, "POST", "k1", "{ \"text\" :\n \"hello\" }") // same JSON, other spacing
	require.Equal(t, 201, replay.status)
	require.Equal(t, "true", replay.header.Get("Idempotent-Replayed"))
	require.Equal(t, "/notes/1", replay.header.Get("Location"), "replayable headers are stored")
	require.Equal(t, first.body, replay.body)
	require.Equal(t, int32(1), b.runs.Load(), "a marked retry reads its key first and runs nothing")

	// Unmarked, the replay's first unit is queued behind the key's read
	// (the phase's code may run), and nothing of it is kept: the answer is
	// the stored one, byte for byte.
	unmarked := b.do(t, "POST", "k1", `{"text":"hello"}`, aphttp.RetryHeaderName, "")
	require.Equal(t, 201, unmarked.status)
	require.Equal(t, "true", unmarked.header.Get("Idempotent-Replayed"))
	require.Equal(t, first.body, unmarked.body)
}

func TestKeyReusedWithAnotherBodyIs422(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	require.Equal(t, 201, b.do(t, "POST", "k", `{"text":"one"}`).status)
	requireProblem(t, b.do(t, "POST", "k", `{"text":"two"}`), 422, aphttp.ProblemKeyReused)
	require.Equal(t, int32(1), b.runs.Load())
}

func TestInProgressIs409WithRetryAfter(t *testing.T) {
	t.Parallel()
	b := setupHeld(t)
	b.block, b.entered = make(chan struct{}), make(chan struct{})
	done := make(chan reply, 1)
	go func() { done <- b.do(t, "POST", "k", `{"text":"slow"}`) }()
	<-b.entered
	busy := b.do(t, "POST", "k", `{"text":"slow"}`)
	requireProblem(t, busy, 409, aphttp.ProblemInProgress)
	require.Equal(t, "1", busy.header.Get("Retry-After"))
	requireProblem(t, b.do(t, "POST", "k", `{"text":"other"}`), 422, aphttp.ProblemKeyReused)
	close(b.block)
	require.Equal(t, 201, (<-done).status)
}

func TestTransientFailureStoresNothingAndResumes(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.fail.Store(true)
	r := b.do(t, "POST", "k", `{"text":"x"}`)
	requireProblem(t, r, 503, aphttp.ProblemTransientFailure)
	require.Equal(t, "1", r.header.Get("Retry-After"))
	require.NotContains(t, string(r.body), "downstream is down", "internal errors are not leaked")
	b.fail.Store(false)
	ok := b.do(t, "POST", "k", `{"text":"x"}`)
	require.Equal(t, 201, ok.status)
	require.Empty(t, ok.header.Get("Idempotent-Replayed"), "the retry ran the workflow, it was not a replay")
}

func TestInvalidBodyIs422AndStoresNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	requireProblem(t, b.do(t, "POST", "k", `not json`), 422, aphttp.ProblemInvalidRequest)
	requireProblem(t, b.do(t, "POST", "k", `{"text":""}`), 422, aphttp.ProblemInvalidRequest)
	require.Equal(t, 201, b.do(t, "POST", "k", `{"text":"fixed"}`).status, "a corrected retry with the same key is processed")
}

func TestUnauthorizedIs401(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	req, _ := http.NewRequest("POST", b.srv.URL+"/notes", strings.NewReader(`{"text":"x"}`))
	req.Header.Set("Idempotency-Key", "k")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 401, resp.StatusCode)
	require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))

	// A scope function that fails for another reason is transient: 503.
	r := b.do(t, "POST", "k", `{"text":"x"}`, "X-User", "flaky")
	requireProblem(t, r, 503, aphttp.ProblemTransientFailure)
	require.Zero(t, b.runs.Load())
}

func TestBodyOverLimitIs413BeforeAnythingIsStored(t *testing.T) {
	t.Parallel()
	b := setup(t, &aphttp.Options{MaxBodyBytes: 64})
	requireProblem(t, b.do(t, "POST", "k", `{"text":"`+strings.Repeat("x", 100)+`"}`), 413, aphttp.ProblemBodyTooLarge)
	require.Equal(t, 201, b.do(t, "POST", "k", `{"text":"small"}`).status, "the key was not stored")
}

// A query string the size of a page would be stored with the key for its
// retention: it is refused with 414 before anything is stored.
func TestPathOverLimitIs414BeforeAnythingIsStored(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	long := "/notes?q=" + strings.Repeat("x", atomicphase.DefaultMaxPathLength)
	requireProblem(t, b.doAt(t, long, "POST", "k", `{"text":"x"}`), 414, aphttp.ProblemURITooLong)
	require.Zero(t, b.runs.Load())
	require.Equal(t, 201, b.do(t, "POST", "k", `{"text":"x"}`).status, "the key was not stored")
}

func TestStoreUnavailableIs503(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=2")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	b := setupOn(t, pool, nil)
	requireProblem(t, b.do(t, "POST", "k", `{"text":"x"}`), 503, aphttp.ProblemStoreUnavailable)
	require.Zero(t, b.runs.Load())
}

func TestMiddlewareRequiresScope(t *testing.T) {
	t.Parallel()
	require.Panics(t, func() {
		aphttp.Middleware(&atomicphase.Runner{}, atomicphase.MustWorkflow("w", func(n note, _ *atomicphase.Request) (note, error) { return n, nil }, []atomicphase.Phase[note]{atomicphase.Local("p", func(context.Context, atomicphase.Tx, *note) (atomicphase.Outcome, error) {
			return atomicphase.Continue(), nil
		})}, nil), nil)
	})
}

// The query string is part of the request: the same key sent with another
// query string is another request, never a replay of the first.
func TestQueryStringIsPartOfTheRequest(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	first := b.doAt(t, "/notes", http.MethodPost, "k", `{"text":"hi"}`)
	require.Equal(t, 201, first.status)
	requireProblem(t, b.doAt(t, "/notes?express=true", http.MethodPost, "k", `{"text":"hi"}`), 422, aphttp.ProblemKeyReused)
	other := b.doAt(t, "/notes?express=true", http.MethodPost, "k2", `{"text":"hi"}`)
	require.Equal(t, 201, other.status)
	requireProblem(t, b.doAt(t, "/notes", http.MethodPost, "k2", `{"text":"hi"}`), 422, aphttp.ProblemKeyReused)
	replay := b.doAt(t, "/notes?express=true", http.MethodPost, "k2", `{"text":"hi"}`)
	require.Equal(t, other.body, replay.body)
	require.Equal(t, "true", replay.header.Get("Idempotent-Replayed"))
	require.EqualValues(t, 2, b.runs.Load())
}

// An error no retry can fix is a final 500 the client does not retry, not a
// 503 that it would retry forever.
// A phase's Answer is written as the workflow gave it, nothing stored: a
// retry runs the phase again.
func TestAnswerIsWrittenAndNotStored(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	for i := range 2 {
		r := b.do(t, http.MethodPost, "k", `{"text":"answer"}`)
		require.Equal(t, http.StatusConflict, r.status)
		require.JSONEq(t, `{"error":"the notebook is locked; nothing saved"}`, string(r.body))
		require.Empty(t, r.header.Get("Idempotent-Replayed"))
		require.EqualValues(t, i+1, b.runs.Load(), "each retry runs the phase")
	}
}

func TestPermanentFailureIs500WithoutRetryAfter(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	r := b.do(t, http.MethodPost, "k", `{"text":"permanent"}`)
	requireProblem(t, r, http.StatusInternalServerError, aphttp.ProblemPermanentFailure)
	require.Empty(t, r.header.Get("Retry-After"))
	// The key is parked: a retry is told so, and runs nothing.
	for range 2 {
		r := b.do(t, http.MethodPost, "k", `{"text":"permanent"}`)
		requireProblem(t, r, http.StatusInternalServerError, aphttp.ProblemParked)
		require.Empty(t, r.header.Get("Retry-After"))
	}
	require.EqualValues(t, 1, b.runs.Load())
}

// An empty scope is the server's bug: a 500, never a shared key space, and
// never blamed on the client's key.
func TestEmptyScopeIs500(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	r := b.do(t, http.MethodPost, "k", `{"text":"hi"}`, "X-User", "anonymous")
	requireProblem(t, r, http.StatusInternalServerError, aphttp.ProblemInvalidScope)
	require.Zero(t, b.runs.Load())
}

// A caller spraying keys meets the Runner's cap on unfinished keys per scope
// as 429 with Retry-After; nothing is stored for the refused key.
func TestTooManyUnfinishedKeysIs429(t *testing.T) {
	t.Parallel()
	db := atomicphasetest.NewDB(t, nil)
	b := setupRunnerOn(t, db.Pool, &atomicphase.Config{MaxUnfinishedPerScope: 1}, nil)
	b.fail.Store(true)
	r := b.do(t, http.MethodPost, "k1", `{"text":"a"}`)
	require.Equal(t, http.StatusServiceUnavailable, r.status, "the first key stays unfinished")
	r = b.do(t, http.MethodPost, "k2", `{"text":"b"}`)
	requireProblem(t, r, http.StatusTooManyRequests, aphttp.ProblemTooManyKeys)
	require.Equal(t, "1", r.header.Get("Retry-After"))
	r = b.do(t, http.MethodPost, "k1", `{"text":"a"}`)
	require.Equal(t, http.StatusServiceUnavailable, r.status, "the unfinished key itself may be retried")
	b.fail.Store(false)
	require.Equal(t, 201, b.do(t, http.MethodPost, "k1", `{"text":"a"}`).status)
	require.Equal(t, 201, b.do(t, http.MethodPost, "k2", `{"text":"b"}`).status, "room again once it finished")
}

// A body the service cannot compare or keep is a final 422, never a 5xx and
// never a crash, whatever its size up to the body limit; nothing is stored,
// so a corrected request may reuse the key.
func TestHostileBodiesAre422(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	deep := strings.Repeat("[", aphttp.DefaultMaxBodyBytes-1)
	for name, body := range map[string]string{
		"nested to the body limit":  deep,
		"nested objects":            strings.Repeat(`{"a":`, 200) + "1" + strings.Repeat("}", 200),
		"beyond double precision":   `{"text":"hi","n":9007199254740993}`,
		"names equal ignoring case": `{"text":"hi","Text":"ho"}`,
		"NUL":                       `{"text":"a\u0000b"}`,
		"lone surrogate":            `{"text":"\ud800"}`,
	} {
		r := b.do(t, http.MethodPost, "k-"+name, body)
		requireProblem(t, r, http.StatusUnprocessableEntity, aphttp.ProblemInvalidRequest)
	}
	require.Zero(t, b.runs.Load())
	require.Equal(t, 201, b.do(t, http.MethodPost, "k-NUL", `{"text":"ab"}`).status, "nothing was stored for the refused body")
}
